"""The decode step's linear layers at the engine's batch shape, with weights streamed from memory
(each of the benchmark model's eight layers has its own weights, as in a real step) against one
layer's weights repeated (hot in cache): how far the memory stream holds the GEMMs under their peak;
and oneDNN on its packed weights against our decode-rows kernel (kernels/decode_gemm.py) on its own,
the two paths vlserve's CpuLinear chooses between at these rows.

BENCH_SPEC's shapes (hidden 1024, intermediate 2816, 16 q / 4 kv heads of 64), best of --repeats;
GFLOP/s over the four linears.

    python benchmarks/decode_gemm_stream.py --rows 8,16,24,32,64 --dtype bfloat16 --threads 2
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
    from vlserve.kernels import decode_gemm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="24", help="comma-separated batch sizes")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    linear = torch.ops.mkldnn._linear_pointwise
    weights = [[torch.randn(n, k).to(dtype) for n, k in SHAPES] for _ in range(LAYERS)]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in layer] for layer in weights]
    ours = [[decode_gemm.pack(w) for w in layer] for layer in weights] if decode_gemm.decode_gemm_op(dtype) else None
    for rows in map(int, args.rows.split(",")):
        x = {k: torch.randn(rows, k).to(dtype) for _, k in SHAPES}

        def onednn_step(layers):
            for packed in layers:
                for (_, k), w in zip(SHAPES, packed):
                    linear(x[k], w, None, "none", [], "")

        def our_step(layers):
            for packed in layers:
                for (n, k), w in zip(SHAPES, packed):
                    decode_gemm.linear(x[k], w, n, None)

        flops = 2 * rows * sum(n * k for n, k in SHAPES) * LAYERS
        cases = [("oneDNN, streamed (8 layers' weights)", onednn_step, onednn),
                 ("oneDNN, hot (one layer's weights x 8)", onednn_step, [onednn[0]] * LAYERS)]
        if ours is not None:
            cases += [("decode_gemm, streamed", our_step, ours), ("decode_gemm, hot", our_step, [ours[0]] * LAYERS)]
        for name, step, layers in cases:
            ms = best_ms(lambda: step(layers), args.repeats)
            print(f"{args.dtype} {rows} rows, {args.threads} threads, {name}: {ms:.2f} ms a step, "
                  f"{flops / ms / 1e6:.0f} GFLOP/s", flush=True)


if __name__ == "__main__":
    main()
