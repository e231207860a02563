"""The decode step's linear layers at the engine's batch shape, with weights streamed from memory
(each of the benchmark model's eight layers has its own weights, as in a real step) against one
layer's weights repeated (hot in cache): how far the memory stream holds the GEMMs under their peak;
and our decode-rows kernel (kernels/decode_gemm.py) on its own packed weights against oneDNN on its
packed weights (what CpuLinear runs instead on AVX-512) and against CpuLinear with the kernel turned
off (whatever this CPU's path is then: on AVX2 the small-row kernel below 32 rows, oneDNN on the
plain weight above, a bf16 weight widened to fp32 from 16 rows).

BENCH_SPEC's shapes (hidden 1024, intermediate 2816, 16 q / 4 kv heads of 64), best of --repeats;
GFLOP/s over the four linears.

    python benchmarks/decode_gemm_stream.py --rows 8,16,24,32,64 --dtype bfloat16 --threads 2
    python benchmarks/decode_gemm_stream.py --rows 2,8,24,64,128,256 --dtype float32 --repeats 10 --out benchmarks/results/decode_gemm_stream_eleventh_fp32.md
"""

import argparse
import contextlib

import torch
from torch import nn

SHAPES = [(1536, 1024), (1024, 1024), (5632, 1024), (1024, 2816)]  # qkv, o, gate_up, down: (out, in)
LAYERS = 8


@contextlib.contextmanager
def decode_kernel_off():
    """Within it CpuLinear sends no rows to kernels/decode_gemm.py: every row takes the path it would
    take without the kernel (benchmarks/decode_gemm_ab.py uses it too)."""
    from vlserve.model import cpu_gemm

    built = cpu_gemm.decode_gemm_rows
    cpu_gemm.decode_gemm_rows = lambda dtype: range(0)
    try:
        yield
    finally:
        cpu_gemm.decode_gemm_rows = built


def cpu_linears(weights: list[torch.Tensor]) -> list[nn.Module]:
    """CpuLinear layers over these weights, packed as the engine packs them at load."""
    from vlserve.model.cpu_gemm import use_cpu_gemm

    layers = []
    for w in weights:
        layer = nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
        layer.weight = nn.Parameter(w, requires_grad=False)
        use_cpu_gemm(layer)
        layers.append(layer)
    return layers


def memory_floor(weights: list[list[torch.Tensor]], repeats: int) -> str:
    """How fast these threads read the step's weights once (a sum over each, the plain layout): the
    floor under a streamed step's time, whatever its arithmetic."""
    from vlserve.bench.timing import best_ms

    nbytes = sum(w.numel() * w.element_size() for layer in weights for w in layer)
    ms = best_ms(lambda: [w.sum() for layer in weights for w in layer], repeats)
    return (f"memory read of the step's weights ({nbytes / 1e6:.0f} MB, torch.sum over each): {ms:.2f} ms, "
            f"{nbytes / ms / 1e6:.1f} GB/s")


def main():
    from vlserve.bench.timing import best_ms
    from vlserve.kernels import decode_gemm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="24", help="comma-separated batch sizes")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", help="also write the lines to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    linear = torch.ops.mkldnn._linear_pointwise
    weights = [[torch.randn(n, k).to(dtype) for n, k in SHAPES] for _ in range(LAYERS)]
    try:
        onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in layer] for layer in weights]
    except RuntimeError as e:  # no packed oneDNN weights of this dtype on this CPU
        print(f"oneDNN cannot pack {args.dtype} weights here ({str(e).splitlines()[0]}): not timed", flush=True)
        onednn = None
    ours = [[decode_gemm.pack(w) for w in layer] for layer in weights] if decode_gemm.decode_gemm_op(dtype) else None
    modules = [cpu_linears(layer) for layer in weights]
    lines = [f"{args.dtype}, {args.threads} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
             f"decode kernel built for {decode_gemm.vector_bits() if ours else 0}-bit vectors, best of {args.repeats}",
             memory_floor(weights, args.repeats)]
    print("\n".join(lines), flush=True)
    for rows in map(int, args.rows.split(",")):
        x = {k: torch.randn(rows, k).to(dtype) for _, k in SHAPES}

        def onednn_step(layers):
            for packed in layers:
                for (_, k), w in zip(SHAPES, packed):
                    linear(x[k], w, None, "none", [], "")

        def without_kernel(layers):
            with decode_kernel_off():
                for layer in layers:
                    for (_, k), linear_layer in zip(SHAPES, layer):
                        linear_layer(x[k])

        def our_step(layers):
            for packed in layers:
                for (n, k), w in zip(SHAPES, packed):
                    decode_gemm.linear(x[k], w, n, None)

        flops = 2 * rows * sum(n * k for n, k in SHAPES) * LAYERS
        cases = [("CpuLinear without the decode kernel, streamed", without_kernel, modules)]
        if onednn is not None:
            cases += [("oneDNN, streamed (8 layers' weights)", onednn_step, onednn),
                      ("oneDNN, hot (one layer's weights x 8)", onednn_step, [onednn[0]] * LAYERS)]
        if ours is not None:
            cases += [("decode_gemm, streamed", our_step, ours), ("decode_gemm, hot", our_step, [ours[0]] * LAYERS)]
        for name, step, layers in cases:
            with torch.inference_mode():
                ms = best_ms(lambda: step(layers), args.repeats)
            lines.append(f"{args.dtype} {rows} rows, {args.threads} threads, {name}: {ms:.2f} ms a step, "
                         f"{flops / ms / 1e6:.0f} GFLOP/s")
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
