"""lpm vs fcfs on few-shot alone, alternating, on the benchmark model (a quick check of scheduling cost).

    python benchmarks/lpm_vs_fcfs.py [--rounds 2] [--threads 2]
"""

import argparse
import os
import tempfile
import time

import torch

from vlserve import Engine
from vlserve.bench import workloads as W
from vlserve.bench.client import Job
from vlserve.bench.models import bench_model


def run(model: str, policy: str, reqs: list[Job]) -> str:
    with Engine(model, schedule_policy=policy, max_total_tokens=65536) as engine:
        engine.generate(prompt="USER: warm up ASSISTANT:", sampling_params={"max_new_tokens": 2})
        start = time.perf_counter()
        outs = engine.generate(prompt=[r.prompt for r in reqs],
                               sampling_params={"max_new_tokens": 16, "temperature": 0, "ignore_eos": True})
        wall = time.perf_counter() - start
        m = engine.metrics
        passes = {mode: int(m.value(m.forward_passes, mode=mode)) for mode in ("prefill", "decode")}
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    return f"{policy}: {len(reqs) / wall:.2f} req/s, forward passes {passes}, cached tokens {cached}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = bench_model(os.path.join(tempfile.gettempdir(), "vlserve-bench-models", "bench"))
    reqs = W.few_shot()
    for _ in range(args.rounds):
        for policy in ("lpm", "fcfs"):
            print(run(model, policy, reqs))


if __name__ == "__main__":
    main()
