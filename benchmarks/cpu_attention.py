"""The batched CPU paged-attention kernel against the per-request references, at BENCH_SPEC's heads
(16 q heads, 4 kv heads, head_dim 64), on random paged batches (page size 1: slots scattered).

Times are the median of --repeats of the process's CPU time (1 thread by default: robust on a
shared machine). Decode: GB/s of K and V read; extend: GFLOP/s of the attention maths.

A second table times decode batches whose requests share prefix slots (the workloads' shapes:
six questions about each of four pictures; 24 continuations of one few-shot prompt; eight
questions about one video) with the kernel's shared-prefix pass off and on.

A third times a bf16 pool's long blocks (extends, the shared pass) as fp32 products on widened
copies (register tiles on AVX-512, BLAS elsewhere) against bf16 dot products (AVX512_BF16; only
where the build has them), in vdpbf16ps and, where the CPU has AMX, on the tile unit.

    python benchmarks/cpu_attention.py --out benchmarks/results/cpu_attention.md
"""

import argparse
import statistics
import time

import torch

from vlserve.bench.report import write_report
from vlserve.kernels import decode_attention_cpu, decode_attention_ref, extend_attention_cpu, extend_attention_ref
from vlserve.kernels.cpu_attention import has_amx, has_bf16_dot
from vlserve.kernels.paged_batch import random_paged_batch, share_prefixes

# (batch, context); 32 x 32: the quantized benchmark's decode batches (16-token prompts, 32 steps)
DECODE = [(32, 32), (1, 300), (8, 300), (32, 300), (32, 1000)]
# (seq_lens, extend_lens); the last is video_qa's shape: 540 new tokens behind a 1,540-token cached prefix
EXTEND = [([287], [287]), ([287] * 8, [30] * 8), ([500] * 2, [500] * 2), ([2080], [540])]
# (name, batch, members per group, shared keys, context)
SHARED = [("4 pictures x 6 questions", 24, 6, 256, 300), ("one few-shot prompt x 24", 24, 24, 726, 760),
          ("one video x 8 questions", 8, 8, 1540, 1580)]


def cpu_ms(fn, repeats: int, calls: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - start) / calls * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode-only", action="store_true", help="only the first table's decode rows")
    ap.add_argument("--out", default="benchmarks/results/cpu_attention.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines = [f"CPU paged attention, {args.threads} thread(s), process CPU time, median of {args.repeats}.", "",
             "| dtype | case | reference ms | batched kernel ms | speed-up | kernel throughput |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for dtype in (torch.float32, torch.bfloat16):
        for batch, context in DECODE:
            b = random_paged_batch([context] * batch, None, 16, 4, 64, dtype, 1, seed=0)
            ref = cpu_ms(lambda: b.decode(decode_attention_ref), args.repeats, 5)
            new = cpu_ms(lambda: b.decode(decode_attention_cpu), args.repeats, 5)
            gbs = batch * context * 4 * 64 * 2 * b.k_buffer.element_size() / new / 1e6
            lines.append(f"| {str(dtype)[6:]} | decode {batch} x {context} | {ref:.2f} | {new:.2f} | "
                         f"{ref / new:.1f}x | {gbs:.1f} GB/s |")
        for seq_lens, extend_lens in ([] if args.decode_only else EXTEND):
            b = random_paged_batch(seq_lens, extend_lens, 16, 4, 64, dtype, 1, seed=0)
            ref = cpu_ms(lambda: b.extend(extend_attention_ref), args.repeats, 2)
            new = cpu_ms(lambda: b.extend(extend_attention_cpu), args.repeats, 2)
            flops = sum(4 * e * (s - e / 2) * 64 * 16 for s, e in zip(seq_lens, extend_lens))
            lines.append(f"| {str(dtype)[6:]} | extend {len(seq_lens)} x {extend_lens[0]} new of {seq_lens[0]} | "
                         f"{ref:.2f} | {new:.2f} | {ref / new:.1f}x | {flops / new / 1e6:.1f} GFLOP/s |")
    if args.decode_only:
        write_report(args.out, "\n".join(lines) + "\n")
        return
    lines += ["", "Decode batches that share prefix slots: the kernel without and with its shared-prefix pass.", "",
              "| dtype | case | per request ms | shared pass ms | speed-up |", "| --- | --- | ---: | ---: | ---: |"]
    for dtype in (torch.float32, torch.bfloat16):
        for name, batch, members, shared, context in SHARED:
            b = random_paged_batch([context] * batch, None, 16, 4, 64, dtype, 1, seed=0)
            share_prefixes(b, [(list(range(g, g + members)), shared) for g in range(0, batch, members)])
            off = cpu_ms(lambda: b.decode(lambda *a: decode_attention_cpu(*a, share_prefixes=False)), args.repeats, 5)
            on = cpu_ms(lambda: b.decode(decode_attention_cpu), args.repeats, 5)
            lines.append(f"| {str(dtype)[6:]} | decode {batch} x {context}, {name} ({shared} shared) | {off:.2f} | "
                         f"{on:.2f} | {off / on:.2f}x |")
    lines += bf16_dot_table(args.repeats)
    write_report(args.out, "\n".join(lines) + "\n")


def bf16_dot_table(repeats: int) -> list[str]:
    if not has_bf16_dot():
        return ["", "bf16 dot products: not in this build (the CPU has no AVX512_BF16)."]
    amx = has_amx()
    lines = ["", "A bf16 pool's long blocks: fp32 products on widened copies (register tiles on AVX-512, BLAS "
             "elsewhere) vs bf16 dot products (`bf16_dot`): vdpbf16ps, and AMX tiles where the CPU has them "
             f"({'here: yes' if amx else 'not here'}).", "",
             "| case | fp32 products ms | vdpbf16ps ms | AMX ms | vdpbf16ps / fp32 | AMX / vdpbf16ps |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]

    def row(case: str, run) -> str:
        blas = cpu_ms(lambda: run(bf16_dot=False), repeats, 2)
        dot = cpu_ms(lambda: run(amx=False), repeats, 2)
        tiles = cpu_ms(lambda: run(), repeats, 2) if amx else float("nan")
        return (f"| {case} | {blas:.2f} | {dot:.2f} | {tiles:.2f} | {blas / dot:.2f}x | "
                f"{dot / tiles:.2f}x |" if amx else f"| {case} | {blas:.2f} | {dot:.2f} | — | {blas / dot:.2f}x | — |")

    for seq_lens, extend_lens in EXTEND:
        b = random_paged_batch(seq_lens, extend_lens, 16, 4, 64, torch.bfloat16, 1, seed=0)
        lines.append(row(f"extend {len(seq_lens)} x {extend_lens[0]} new of {seq_lens[0]}",
                         lambda b=b, **kw: b.extend(lambda *a: extend_attention_cpu(*a, **kw))))
    for name, batch, members, shared, context in SHARED:
        b = random_paged_batch([context] * batch, None, 16, 4, 64, torch.bfloat16, 1, seed=0)
        share_prefixes(b, [(list(range(g, g + members)), shared) for g in range(0, batch, members)])
        lines.append(row(f"decode {batch} x {context}, {name} ({shared} shared)",
                         lambda b=b, **kw: b.decode(lambda *a: decode_attention_cpu(*a, **kw))))
    return lines


if __name__ == "__main__":
    main()
