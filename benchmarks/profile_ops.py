"""Which torch ops take the engine loop's time on one workload: torch.profiler over the scheduling
thread (the ops that thread runs; intra-op worker threads are not listed), self CPU time per op.
profile_engine.py buckets a cProfile of the same loop; this names the ops.

    python benchmarks/profile_ops.py --workload questions_per_image --dtype bfloat16 --threads 2
"""

import argparse
import time

import torch

from vlserve import Engine
from vlserve.bench import workloads as W
from vlserve.bench.client import EngineClient, Job
from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.engine.loop import EngineLoop


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
    try:
        with Engine(model_dir, num_threads=args.threads, dtype=args.dtype) as engine:
            client = EngineClient(engine)
            client.generate([Job("USER: warm up the engine ASSISTANT:", max_new_tokens=2, ignore_eos=True)])
            start = time.monotonic()
            client.generate(W.WORKLOADS[args.workload]())
            wall = time.monotonic() - start
    finally:
        EngineLoop._run = original
    events = profiles[0].key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e3
    print(f"{args.workload}, {args.dtype}, {args.threads} threads: {wall:.2f} s wall (warm-up included in "
          f"the profile: {total:.0f} ms of self time on the loop thread)")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"  {e.key[:48]:48} {e.self_cpu_time_total / 1e3:8.1f} ms  {e.count:6d} calls")


if __name__ == "__main__":
    main()
