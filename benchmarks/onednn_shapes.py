"""What a new row count costs a oneDNN linear: its primitive is built (and JIT-compiled) per shape and
cached, so the first call with each row count pays for the build. Times one BENCH_SPEC-sized layer
(1024 -> 1024, weight packed as CpuLinear packs it) over 80 consecutive row counts it has not seen,
then over the same counts again (built), in fp32 and bf16; then the next 80 counts through
cpu_gemm.onednn_rows' few counts (here 3 or 4; cpu_gemm._onednn pads bf16 calls so, not fp32 ones),
first and second time.

    python benchmarks/onednn_shapes.py --out benchmarks/results/onednn_shapes.md
"""

import argparse
import time

import torch

from vlserve.bench.report import write_report
from vlserve.model import cpu_gemm


def per_call_ms(fn, xs) -> float:
    start = time.perf_counter()
    for x in xs:
        fn(x)
    return (time.perf_counter() - start) / len(xs) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--first", type=int, default=401, help="the first of the 80 row counts")
    ap.add_argument("--out", default="benchmarks/results/onednn_shapes.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines = [f"oneDNN linear 1024 -> 1024, packed weight, {args.threads} threads; ms a call, 80 consecutive row "
             f"counts from {args.first} (CPU capability {torch.backends.cpu.get_cpu_capability()})", "",
             "| dtype | path | first time (counts not seen) | again (built) |", "| --- | --- | ---: | ---: |"]
    linear = torch.ops.mkldnn._linear_pointwise
    for offset, dtype in ((0, torch.float32), (200, torch.bfloat16)):  # bf16 on counts fp32 did not build
        w = torch.randn(1024, 1024).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, cpu_gemm.PACK_HINT_ROWS)
        raw = [torch.randn(args.first + offset + i, 1024).to(dtype) for i in range(80)]
        plain = lambda x: linear(x, packed, None, "none", [], "")  # noqa: E731
        def padded(x):
            full = cpu_gemm.pad_rows(x, cpu_gemm.onednn_rows(x.shape[0]))
            return linear(full, packed, None, "none", [], "")[: x.shape[0]]

        lines.append(f"| {str(dtype)[6:]} | as they come | {per_call_ms(plain, raw):.2f} | {per_call_ms(plain, raw):.2f} |")
        shifted = [torch.randn(x.shape[0] + 80, 1024).to(dtype) for x in raw]  # the next 80: not seen either
        lines.append(f"| {str(dtype)[6:]} | padded (onednn_rows) | {per_call_ms(padded, shifted):.2f} | "
                     f"{per_call_ms(padded, shifted):.2f} |")
    write_report(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
