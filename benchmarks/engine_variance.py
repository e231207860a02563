"""How much of a side-by-side run's spread belongs to the engine instance and how much to the hour:
several fresh Engines, each timing several batches of one workload (every cache emptied before each
batch, as workloads.py does), with a memory-copy bandwidth probe and the GEMM peak sampled on threads
of their own just before every batch.

    python benchmarks/engine_variance.py --workload few_shot --dtype bfloat16 --engines 6 --batches 3 \
        --out benchmarks/results/engine_variance_bf16.md
    python benchmarks/engine_variance.py ... --together      # every engine loaded at once, batches in turn

Why (benchmarks/RESULTS.md, twentieth pass): in the side-by-side runs one vlserve run's three batches
are nearly equally fast, or equally slow, while the GEMM peak sampled beside a slow one reads normal.
One engine after another (the default, as workloads.py runs them), a slow engine cannot be told from
a slow spell of the host that lasts its few seconds. With --together the engines' batches alternate,
so a spell falls on all of them alike: if the spread between engines stays as wide, it is the
engine instance's own (where its memory landed); if it shrinks below the spread within one, it was
the hour's. Probes run before each batch, not during it: the engine has the cores to itself while
it is timed.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import torch

from vlserve.bench import workloads as W
from vlserve.bench.client import EngineClient, Job
from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.bench.own_thread import on_own_thread
from vlserve.bench.report import write_report
from vlserve.bench.roofline import gemm_peak

COPY_MIB = 256  # far beyond the last-level cache: the copy runs at memory bandwidth
PROBE_SECONDS = 0.5


@dataclass
class EngineSample:
    engine: int
    batch_walls_s: list[float]
    copy_gb_s: list[float]  # read + write bandwidth just before each batch
    gemm_gflops: list[float]  # GEMM peak in the run's dtype just before each batch


def copy_bandwidth(src: torch.Tensor, dst: torch.Tensor) -> float:
    """GB/s moved (read + write) by dst.copy_(src) over PROBE_SECONDS, on a thread of its own."""
    def measure() -> float:
        dst.copy_(src)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < PROBE_SECONDS:
            dst.copy_(src)
            n += 1
        return 2 * src.numel() * src.element_size() * n / (time.perf_counter() - start) / 1e9
    return on_own_thread(measure, "copy-bandwidth")


def _open_engine(stack: ExitStack, model_dir: str, threads: int, dtype: str) -> EngineClient:
    from vlserve import Engine

    engine = stack.enter_context(Engine(model_dir, num_threads=threads, video_frames=W.VIDEO_FRAMES, dtype=dtype,
                                        schedule_policy="lpm"))
    client = EngineClient(engine)
    client.generate([Job("USER: warm up the engine ASSISTANT:", max_new_tokens=2, ignore_eos=True)])
    return client


def _timed_batch(client: EngineClient, reqs: list[Job], sample: EngineSample, dtype: str,
                 buffers: tuple[torch.Tensor, torch.Tensor]) -> None:
    sample.copy_gb_s.append(round(copy_bandwidth(*buffers), 1))
    sample.gemm_gflops.append(round(gemm_peak(dtype=getattr(torch, dtype), seconds=PROBE_SECONDS)[0], 1))
    if not client.engine.flush_cache():
        raise RuntimeError("the engine was still busy before a timed batch")
    start = time.monotonic()
    client.generate(reqs)
    sample.batch_walls_s.append(round(time.monotonic() - start, 3))


def sample_in_turn(model_dir: str, reqs: list[Job], engines: int, batches: int, threads: int, dtype: str,
                   buffers: tuple[torch.Tensor, torch.Tensor]) -> list[EngineSample]:
    """One engine at a time, each timing all its batches, then closed (as workloads.py runs them)."""
    samples = []
    for index in range(1, engines + 1):
        sample = EngineSample(index, [], [], [])
        with ExitStack() as stack:
            client = _open_engine(stack, model_dir, threads, dtype)
            for _ in range(batches):
                _timed_batch(client, reqs, sample, dtype, buffers)
        del client
        gc.collect()  # the engine's reference cycles hold its weights until a full collection
        samples.append(sample)
    return samples


def sample_together(model_dir: str, reqs: list[Job], engines: int, batches: int, threads: int, dtype: str,
                    buffers: tuple[torch.Tensor, torch.Tensor]) -> list[EngineSample]:
    """Every engine loaded at once and their batches taken in turn (engine 1, 2, ..., 1, 2, ...): a
    slow spell of the host falls on all of them alike, so what still sets one engine apart is its own."""
    samples = [EngineSample(index, [], [], []) for index in range(1, engines + 1)]
    with ExitStack() as stack:
        clients = [_open_engine(stack, model_dir, threads, dtype) for _ in samples]
        for _ in range(batches):
            for client, sample in zip(clients, samples):
                _timed_batch(client, reqs, sample, dtype, buffers)
    return samples


def spreads(samples: list[EngineSample]) -> dict[str, float]:
    """Within: the median over engines of (slowest / fastest batch - 1). Between: the slowest
    engine's median batch over the fastest engine's, - 1."""
    medians = [statistics.median(s.batch_walls_s) for s in samples]
    within = statistics.median(max(s.batch_walls_s) / min(s.batch_walls_s) - 1 for s in samples)
    return {"within_engine": round(within, 4), "between_engines": round(max(medians) / min(medians) - 1, 4)}


def markdown(samples: list[EngineSample], meta: dict) -> str:
    s = spreads(samples)
    lines = [f"Command: `{meta['command']}`  ", f"Date: {meta['date']}; load average {meta['load']} at start  ",
             f"Model: {meta['model']}; workload {meta['workload']}, {meta['requests']} requests, "
             f"{meta['order']}; caches emptied before every batch; probes run just before each batch, on their own threads", "",
             "| engine | batch walls s | median s | copy GB/s before each | GEMM peak GFLOP/s before each |",
             "| ---: | --- | ---: | --- | --- |"]
    for e in samples:
        lines.append(f"| {e.engine} | {', '.join(f'{w:.3f}' for w in e.batch_walls_s)} | "
                     f"{statistics.median(e.batch_walls_s):.3f} | {', '.join(map(str, e.copy_gb_s))} | "
                     f"{', '.join(map(str, e.gemm_gflops))} |")
    lines += ["", f"Spread within an engine (median over engines of slowest / fastest batch - 1): "
                  f"**{100 * s['within_engine']:.1f}%**; between engines (slowest engine's median batch / "
                  f"fastest's - 1): **{100 * s['between_engines']:.1f}%**.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="few_shot", choices=list(W.WORKLOADS))
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--engines", type=int, default=5, help="fresh engines, one after another")
    ap.add_argument("--batches", type=int, default=4, help="timed batches per engine")
    ap.add_argument("--together", action="store_true",
                    help="load every engine at once and take their batches in turn (else one engine after another)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", help="use this checkpoint instead of the benchmark model")
    ap.add_argument("--out", default="benchmarks/results/engine_variance.md")
    args = ap.parse_args(argv)
    if args.engines < 2 or args.batches < 2:
        ap.error("--engines and --batches must each be at least 2 (a spread needs two samples)")
    torch.set_num_threads(args.threads)
    model_dir = args.model or bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    reqs = W.WORKLOADS[args.workload]()
    src = torch.ones(COPY_MIB << 20, dtype=torch.uint8)
    buffers = (src, torch.empty_like(src))
    meta = {"command": "python benchmarks/engine_variance.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "load": open("/proc/loadavg").read().split()[0],
            "model": f"{model_dir} in {args.dtype}, {args.threads} torch threads",
            "workload": args.workload, "requests": len(reqs),
            "order": "engines loaded together, batches in turn" if args.together else "one engine after another"}
    sample = sample_together if args.together else sample_in_turn
    samples = sample(model_dir, reqs, args.engines, args.batches, args.threads, args.dtype, buffers)
    write_report(args.out, markdown(samples, meta))
    with open(args.out.rsplit(".", 1)[0] + ".json", "w") as f:
        json.dump({**meta, "spreads": spreads(samples), "engines": [asdict(s) for s in samples]}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
