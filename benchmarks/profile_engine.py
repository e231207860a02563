"""Where the engine loop's time goes, before vs after the CPU speed work: a cProfile of the
scheduling thread over one workload, bucketed into GEMM, attention, sampling, other torch ops and
Python (scheduling, batch building, everything interpreted).

- before: plain F.linear, the per-request reference attention and eager elementwise ops (our CPU
  kernels made unavailable, which is the documented fallback; linears left as nn.Linear)
- after:  the defaults (CPU GEMM path, batched C++ attention, fused elementwise kernels)

    python benchmarks/profile_engine.py --workload questions_per_image --out benchmarks/results/profile_engine.md

Buckets (tottime, i.e. time in the function itself, except where a whole call tree is one bucket):
- GEMM: F.linear and oneDNN's _linear_pointwise (self time)
- attention: the whole AttentionBackend.forward call (cumulative)
- sampling: the whole vlserve.sampling.sampler.sample call (cumulative)
- other torch ops: every other builtin (C) function under the loop: norms, RoPE, embedding, copies
- Python: every Python function's self time outside the attention and sampling trees
"""

import argparse
import cProfile
import pstats
import time

import torch

from vlserve.bench import workloads as W
from vlserve.bench.client import EngineClient, Job
from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.bench.report import write_report


def profile_run(model_dir: str, jobs: list[Job], threads: int, before: bool) -> tuple[pstats.Stats, float]:
    from vlserve import Engine
    from vlserve.engine.loop import EngineLoop
    from vlserve.kernels import cpu_attention
    from vlserve.model import llama, loader

    saved = cpu_attention.cpu_attention_op, loader.use_cpu_gemm, llama.fused_op
    if before:
        cpu_attention.cpu_attention_op = lambda: None
        loader.use_cpu_gemm = lambda model: 0
        llama.fused_op = lambda x: None
    profiler = cProfile.Profile()
    original_loop = EngineLoop._run

    def profiled_loop(self):
        profiler.enable()
        try:
            original_loop(self)
        finally:
            profiler.disable()

    EngineLoop._run = profiled_loop
    try:
        with Engine(model_dir, num_threads=threads) as engine:
            client = EngineClient(engine)
            client.generate([Job("USER: warm up the engine ASSISTANT:", max_new_tokens=2, ignore_eos=True)])
            profiler.clear() if hasattr(profiler, "clear") else None
            start = time.monotonic()
            client.generate(jobs)
            wall = time.monotonic() - start
    finally:
        EngineLoop._run = original_loop
        cpu_attention.cpu_attention_op, loader.use_cpu_gemm, llama.fused_op = saved
    return pstats.Stats(profiler), wall


def buckets(stats: pstats.Stats) -> dict[str, float]:
    gemm = attention = sampling = builtin = python = idle = 0.0
    for (file, _line, name), (_cc, _nc, tottime, cumtime, _callers) in stats.stats.items():
        if name == "forward" and file.endswith("model/attention.py"):
            attention += cumtime
        elif name == "sample" and file.endswith("sampling/sampler.py"):
            sampling += cumtime
    inside = _inside_trees(stats, {("model/attention.py", "forward"), ("sampling/sampler.py", "sample")})
    for key, (_cc, _nc, tottime, _cumtime, _callers) in stats.stats.items():
        file, _line, name = key
        if key in inside:
            continue
        if file == "~":
            if "linear" in name:
                gemm += tottime
            elif "acquire" in name or "wait" in name or "sleep" in name:
                idle += tottime  # the loop blocking on its inbox between batches
            else:
                builtin += tottime
        else:
            python += tottime
    return {"GEMM": gemm, "attention": attention, "sampling": sampling, "other torch ops": builtin,
            "Python": python, "idle (waiting for work)": idle}


def _inside_trees(stats: pstats.Stats, roots: set[tuple[str, str]]) -> set:
    """Every function reached only from inside the given roots' call trees (their time is counted
    with the root's cumulative time)."""
    callees: dict = {}
    for key, (_cc, _nc, _tt, _ct, callers) in stats.stats.items():
        for caller in callers:
            callees.setdefault(caller, set()).add(key)
    start = {k for k in stats.stats if any(k[0].endswith(f) and k[2] == n for f, n in roots)}
    seen, todo = set(start), list(start)
    while todo:
        for child in callees.get(todo.pop(), ()):
            if child not in seen and all(c in seen for c in stats.stats[child][4]):
                seen.add(child)
                todo.append(child)
    return seen


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="questions_per_image", choices=list(W.WORKLOADS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model")
    ap.add_argument("--out", default="benchmarks/results/profile_engine.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model or bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    jobs = W.WORKLOADS[args.workload]()
    rows = {}
    for name, before in (("before", True), ("after", False)):
        stats, wall = profile_run(model_dir, jobs, args.threads, before)
        rows[name] = (buckets(stats), wall)
    names = list(rows["before"][0])
    lines = [f"cProfile of the engine loop thread, workload {args.workload} ({len(jobs)} requests), BENCH_SPEC, "
             f"{args.threads} threads. Seconds (share of the profiled loop time).", "",
             "| bucket | before s (share) | after s (share) |", "| --- | ---: | ---: |"]
    totals = {k: sum(v for n, v in b.items() if not n.startswith("idle")) for k, (b, _) in rows.items()}
    for bucket in names:
        cells = []
        for k in ("before", "after"):
            v = rows[k][0][bucket]
            share = "" if bucket.startswith("idle") else f" ({v / totals[k]:.0%})"
            cells.append(f"{v:.2f}{share}")
        lines.append(f"| {bucket} | " + " | ".join(cells) + " |")
    lines.append(f"| busy total | {totals['before']:.2f} | {totals['after']:.2f} |")
    lines.append(f"| workload wall s | {rows['before'][1]:.2f} | {rows['after'][1]:.2f} |")
    text = "\n".join(lines) + "\n"
    write_report(args.out, text)


if __name__ == "__main__":
    main()
