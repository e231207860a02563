"""Why the engine loads and runs its model on one thread (vlserve/engine/compute_thread.py): the
decode step's linear layers (BENCH_SPEC's shapes, 24 rows, CpuLinear's paths) timed on a worker
thread, first while no other thread has run a parallel torch op, then after the main thread has
(so the main thread keeps an idle OpenMP team of its own, as it did when it loaded the model).

    python benchmarks/openmp_teams.py --dtype bfloat16 --threads 2
"""

import argparse
import time

import torch
from torch import nn

from vlserve.bench.own_thread import on_own_thread
from vlserve.model.cpu_gemm import use_cpu_gemm

SHAPES = [(1536, 1024), (1024, 1024), (5632, 1024), (1024, 2816)]  # qkv, o, gate_up, down: (out, in)
LAYERS = 8


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    def setup():
        torch.set_num_threads(args.threads)
        layers = [[nn.Linear(k, n, bias=False).to(dtype) for n, k in SHAPES] for _ in range(LAYERS)]
        for layer in layers:
            for m in layer:
                use_cpu_gemm(m)
        return layers, {k: torch.randn(args.rows, k).to(dtype) for _, k in SHAPES}

    layers, x = on_own_thread(setup)

    def timed():
        torch.set_num_threads(args.threads)
        best = float("inf")
        with torch.inference_mode():
            for _ in range(args.repeats):
                start = time.perf_counter()
                for layer in layers:
                    for (_, k), m in zip(SHAPES, layer):
                        m(x[k])
                best = min(best, time.perf_counter() - start)
        return best * 1e3

    alone = on_own_thread(timed)
    torch.randn(4096, 4096) @ torch.randn(4096, 4096)  # the main thread's own parallel op: its team stays
    beside = on_own_thread(timed)
    print(f"{args.dtype}, {args.rows} rows, {args.threads} threads: a step's linears on a worker thread "
          f"{alone:.2f} ms with no other OpenMP team, {beside:.2f} ms once the main thread has one "
          f"({beside / alone:.2f}x)")


if __name__ == "__main__":
    main()
