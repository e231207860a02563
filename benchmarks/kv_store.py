"""Storing a step's new K and V into the paged pool: KVPool.write through the fused `store_kv` row
copies (the CPU path) against KVPool.write through index_copy_ (its fallback, what it ran before),
at BENCH_SPEC's KV shape (4 kv heads of 64), K and V as views of a fused qkv output, slots scattered
over a 200k-slot pool. Wall time per call, the best of --repeats runs of --calls calls; the figures
are per layer (K and V together).

    python benchmarks/kv_store.py --dtype float32 --threads 2 --out benchmarks/results/kv_store_fourteenth.md
"""

import argparse
import contextlib

import torch

from vlserve.bench.report import write_report
from vlserve.bench.timing import best_ms
from vlserve.memory import kv_pool
from vlserve.memory.kv_pool import KVPool

TOKENS = [1, 24, 96, 450, 784, 2048]  # decode batches, a prefill chunk, a whole prefill
HEADS, DIM, SLOTS, Q_SIZE = 4, 64, 200_000, 1024


@contextlib.contextmanager
def fused_store_off():
    """Within it KVPool.write finds no fused kernels and takes its index_copy_ fallback."""
    found = kv_pool.fused_op
    kv_pool.fused_op = lambda x: None
    try:
        yield
    finally:
        kv_pool.fused_op = found


def per_call_us(fn, calls: int, repeats: int) -> float:
    """One call's time: the best of `repeats` runs of `calls` calls (one call is a few microseconds)."""
    return best_ms(lambda: [fn() for _ in range(calls)], repeats) / calls * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/kv_store.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    pool = KVPool.create(1, SLOTS, HEADS, DIM, dtype)
    for buffer in (pool.k_buffers[0], pool.v_buffers[0]):
        buffer.zero_()  # every page touched once, as in a server that has run a while
    lines = [f"KV store, {args.dtype}, {args.threads} thread(s), per layer (K and V), best of {args.repeats}"
             f" x {args.calls} calls.", "",
             "| new tokens | index_copy_ us | store_kv us | speed-up | store_kv GB/s |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    g = torch.Generator().manual_seed(0)
    for tokens in TOKENS:
        slots = torch.randperm(SLOTS, generator=g)[:tokens].to(torch.int32)
        qkv = torch.randn(tokens, Q_SIZE + 2 * HEADS * DIM, generator=g).to(dtype)
        k = qkv[:, Q_SIZE:Q_SIZE + HEADS * DIM].view(tokens, HEADS, DIM)
        v = qkv[:, Q_SIZE + HEADS * DIM:].view(tokens, HEADS, DIM)
        with fused_store_off():
            before = per_call_us(lambda: pool.write(0, slots, k, v), args.calls, args.repeats)
        after = per_call_us(lambda: pool.write(0, slots, k, v), args.calls, args.repeats)
        gbs = 2 * k.numel() * k.element_size() / after / 1e3
        lines.append(f"| {tokens} | {before:.1f} | {after:.1f} | {before / after:.2f}x | {gbs:.1f} |")
        assert torch.equal(pool.k_buffers[0][slots.long()], k) and torch.equal(pool.v_buffers[0][slots.long()], v)
    write_report(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
