"""Which torch ops take the engine loop's time on one workload: torch.profiler over the scheduling
thread (the ops that thread runs; intra-op worker threads are not listed), self CPU time per op.
profile_engine.py buckets a cProfile of the same loop; this names the ops. Each forward is marked
by its mode, so the ops are also charged to the decode or the extend forwards they ran in (the
direct children of ModelRunner.forward; their totals include what they call), with each mode's
forward count and time.

    python benchmarks/profile_ops.py --workload questions_per_image --dtype bfloat16 --threads 2
"""

import argparse
import time

import torch

from vlserve import Engine
from vlserve.bench import workloads as W
from vlserve.bench.client import EngineClient, Job
from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.core.forward_batch import ForwardMode
from vlserve.engine.loop import EngineLoop
from vlserve.runner.model_runner import ModelRunner


def marked_forward(forward):
    """ModelRunner.forward inside a profiler range named FORWARD_<mode>."""
    def run(self, batch):
        mode = "decode" if batch.mode == ForwardMode.DECODE else "extend"
        with torch.profiler.record_function(f"FORWARD_{mode}"):
            return forward(self, batch)
    return run


def by_mode(prof, top: int) -> list[str]:
    """Per mode: forwards, their time, and their direct children's total time by op."""
    lines = []
    events = prof.events()
    for mode in ("decode", "extend"):
        roots = [e for e in events if e.name == f"FORWARD_{mode}"]
        ops: dict[str, list[float]] = {}
        for root in roots:
            for child in root.cpu_children:
                ops.setdefault(child.name, [0.0, 0])
                ops[child.name][0] += child.cpu_time_total
                ops[child.name][1] += 1
        total = sum(r.cpu_time_total for r in roots) / 1e3
        lines.append(f"{mode}: {len(roots)} forwards, {total:.1f} ms")
        for name, (us, n) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]:
            lines.append(f"  {name[:48]:48} {us / 1e3:8.1f} ms  {n:6d} calls")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="questions_per_image", choices=list(W.WORKLOADS))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    profiles = []
    original = EngineLoop._run

    def profiled(self):  # the profiler records the thread it is entered on: the loop's own
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            profiles.append(prof)
            original(self)

    EngineLoop._run = profiled
    forward = ModelRunner.forward
    ModelRunner.forward = marked_forward(forward)
    try:
        with Engine(model_dir, num_threads=args.threads, dtype=args.dtype) as engine:
            client = EngineClient(engine)
            client.generate([Job("USER: warm up the engine ASSISTANT:", max_new_tokens=2, ignore_eos=True)])
            start = time.monotonic()
            client.generate(W.WORKLOADS[args.workload]())
            wall = time.monotonic() - start
    finally:
        EngineLoop._run = original
        ModelRunner.forward = forward
    events = profiles[0].key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e3
    print(f"{args.workload}, {args.dtype}, {args.threads} threads: {wall:.2f} s wall (warm-up included in "
          f"the profile: {total:.0f} ms of self time on the loop thread)")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"  {e.key[:48]:48} {e.self_cpu_time_total / 1e3:8.1f} ms  {e.count:6d} calls")
    print("\n".join(by_mode(profiles[0], args.top)))


if __name__ == "__main__":
    main()
