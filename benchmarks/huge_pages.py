"""The decode-rows GEMM on weights in ordinary 4 KiB pages against the same weights copied onto huge
pages (vlserve/model/huge_pages.py): the benchmark model's eight layers' packed weights, each
layer's own (streamed from memory, as in a decode step), the two copies timed in alternation in
one process, so that the host's slow spells fall on both.

    python benchmarks/huge_pages.py --rows 8,24,64 --dtype bfloat16
    python benchmarks/huge_pages.py --rows 24 --dtype float32 --rounds 40 --out benchmarks/results/huge_pages_fp32.md
"""

import argparse
import statistics
import time

import torch

from vlserve.bench.report import write_report
from vlserve.kernels import decode_gemm
from vlserve.model.huge_pages import huge_page_bytes, huge_page_copy

SHAPES = [(1536, 1024), (1024, 1024), (5632, 1024), (1024, 2816)]  # qkv, o, gate_up, down: (out, in)
LAYERS = 8


def step(weights: list[list[torch.Tensor]], xs: dict[int, torch.Tensor]) -> float:
    start = time.perf_counter()
    for layer in weights:
        for (out_features, in_features), packed in zip(SHAPES, layer):
            decode_gemm.linear(xs[in_features], packed, out_features, None)
    return time.perf_counter() - start


def measure(rows: int, dtype: torch.dtype, rounds: int) -> dict[str, list[float]]:
    torch.manual_seed(0)
    plain = [[decode_gemm.pack(torch.randn(o, i).to(dtype) * 0.02) for o, i in SHAPES] for _ in range(LAYERS)]
    before = huge_page_bytes()
    huge = [[huge_page_copy(p) for p in layer] for layer in plain]
    granted = huge_page_bytes() - before
    xs = {i: torch.randn(rows, i).to(dtype) for _, i in SHAPES}
    with torch.inference_mode():
        for (o, i), p, h in zip(SHAPES, plain[0], huge[0]):  # the same bits from either copy
            assert torch.equal(decode_gemm.linear(xs[i], p, o, None), decode_gemm.linear(xs[i], h, o, None))
        times = {"4 KiB pages": [], "huge pages": []}
        step(plain, xs), step(huge, xs)
        for r in range(rounds):
            order = (("4 KiB pages", plain), ("huge pages", huge))
            for name, weights in order if r % 2 == 0 else order[::-1]:
                times[name].append(step(weights, xs))
    times["_granted"] = [granted]
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="24")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if decode_gemm.decode_gemm_op(dtype) is None:
        raise SystemExit(f"the decode-rows kernel does not run {args.dtype} on this CPU")
    nbytes = sum(o * i for o, i in SHAPES) * LAYERS * dtype.itemsize
    lines = [f"Decode-rows GEMM, {LAYERS} layers' packed weights ({nbytes / 1e6:.0f} MB, {args.dtype}), "
             f"{args.threads} threads, {args.rounds} alternating rounds; a step = every layer's four linears.", "",
             "| rows | huge pages granted | 4 KiB pages: median / best ms | huge pages: median / best ms "
             "| speed-up (median / best) |", "| ---: | ---: | ---: | ---: | ---: |"]
    for rows in (int(r) for r in args.rows.split(",")):
        t = measure(rows, dtype, args.rounds)
        small, huge = t["4 KiB pages"], t["huge pages"]
        lines.append(f"| {rows} | {t['_granted'][0] / 1e6:.0f} MB | {statistics.median(small) * 1e3:.2f} / "
                     f"{min(small) * 1e3:.2f} | {statistics.median(huge) * 1e3:.2f} / {min(huge) * 1e3:.2f} | "
                     f"{statistics.median(small) / statistics.median(huge):.2f}x / {min(small) / min(huge):.2f}x |")
    report = "\n".join(lines) + "\n"
    if args.out:
        write_report(args.out, report)  # prints it too
    else:
        print(report)


if __name__ == "__main__":
    main()
