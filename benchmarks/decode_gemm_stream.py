"""The decode step's linear layers at the engine's batch shape, with weights streamed from memory
(each of the benchmark model's eight layers has its own weights, as in a real step) against one
layer's weights repeated (hot in cache): how far the memory stream holds the GEMMs under their peak.

oneDNN on packed weights (what vlserve's CpuLinear runs), BENCH_SPEC's shapes (hidden 1024,
intermediate 2816, 16 q / 4 kv heads of 64), best of --repeats; GFLOP/s over the four linears.

    python benchmarks/decode_gemm_stream.py --rows 24 --dtype bfloat16 --threads 2
"""

import argparse
import time

import torch

SHAPES = [(1536, 1024), (1024, 1024), (5632, 1024), (1024, 2816)]  # qkv, o, gate_up, down: (out, in)
LAYERS = 8


def best_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    linear = torch.ops.mkldnn._linear_pointwise
    packed = [[torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k).to(dtype), 32) for n, k in SHAPES]
              for _ in range(LAYERS)]
    x = {k: torch.randn(args.rows, k).to(dtype) for _, k in SHAPES}

    def step(layers):
        for weights in layers:
            for (_, k), w in zip(SHAPES, weights):
                linear(x[k], w, None, "none", [], "")

    flops = 2 * args.rows * sum(n * k for n, k in SHAPES) * LAYERS
    for name, layers in (("streamed (8 layers' weights)", packed), ("hot (one layer's weights x 8)", [packed[0]] * LAYERS)):
        ms = best_ms(lambda: step(layers), args.repeats)
        print(f"{args.dtype} {args.rows} rows, {args.threads} threads, {name}: {ms:.2f} ms a step, "
              f"{flops / ms / 1e6:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
