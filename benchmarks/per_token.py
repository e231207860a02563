"""Per computed token: prefill tokens/s and decode tokens/s at batch 1, 8 and 32, before vs after
the CPU speed work, on BENCH_SPEC (random-weight LLaVA, 104.7 M parameters).

Configurations (same checkpoint, same threads, same requests):
- before:      plain F.linear (MKL), the per-request reference attention (`reference` backend) and
               eager elementwise ops
- after:       the CPU GEMM path (vlserve/cpu/gemm.py) and the batched C++ paged attention
- after-bf16:  the same in bf16 (bf16 weights and KV pool)
- after-no-small-gemm: `after` without the small-row GEMM kernel (oneDNN / MKL at every size): what
  the kernel adds, in the same run
- after-no-fused: `after` with the decoder's norms, rotary, SiLU·mul and KV stores as eager PyTorch
  instead of the fused kernels (kernels/csrc/fused_cpu.cpp)

Each configuration is a KernelConfig (vlserve/core/config.py) given to load_model: the switches
`vlserve serve --disable-cpu-gemm / --disable-small-gemm / --disable-fused-ops` set.

Each run drives the ModelRunner directly (no scheduler): B requests of --prompt new tokens each
(half of them behind a cached prefix of --prefix tokens when --prefix > 0), prefilled in one
forward, then --steps decode forwards of B tokens. Batch building is inside the timed region (it is
part of every step). --clock cpu times with the process's CPU time instead of the wall clock: on a
machine shared with other jobs, use it with --threads 1 (CPU time then excludes the time the
process waits for a core, which the wall clock counts and other jobs decide). Configurations run
in turn, in alternating order, --repeats times; the table
gives medians and after/before ratios from the same run.

    python benchmarks/per_token.py --threads 2 --out benchmarks/results/per_token.md
    python benchmarks/per_token.py --threads 1 --clock cpu --out benchmarks/results/per_token_cpu1.md
"""

import argparse
import json
import os
import platform
import statistics
import time

import torch

from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.core.forward_batch import ExtendSlice, build_forward_batch
from vlserve.runner.model_runner import ModelRunner
from vlserve.model.loader import load_model
from vlserve.bench.report import write_report
from vlserve.core.config import KernelConfig

CONFIGS = {
    "before": {"kernels": KernelConfig(cpu_gemm=False, fused_ops=False), "attention": "reference", "dtype": "float32"},
    "after": {"kernels": KernelConfig(), "attention": "torch", "dtype": "float32"},
    "after-bf16": {"kernels": KernelConfig(), "attention": "torch", "dtype": "bfloat16"},
    "after-no-small-gemm": {"kernels": KernelConfig(small_gemm=False), "attention": "torch", "dtype": "float32"},
    "after-no-fused": {"kernels": KernelConfig(fused_ops=False), "attention": "torch", "dtype": "float32"},
}


class Harness:
    """One loaded model and runner; runs a prefill + decode of a batch and times both."""

    def __init__(self, model_dir: str, config: dict, max_batch: int, context: int, clock=time.perf_counter):
        self.clock = clock
        loaded = load_model(model_dir, dtype=config["dtype"], kernels=config["kernels"])
        self.runner = ModelRunner.standalone(loaded, max_total_tokens=max_batch * context + 64,
                                             max_running_requests=max_batch + 1, context_length=context,
                                             attention_backend=config["attention"])
        self.held: dict[int, int] = {}  # row -> tokens it holds slots for

    def _slice(self, row: int, prefix_len: int, ids: list[int]) -> ExtendSlice:
        table = self.runner.memory.req_to_token
        last = table.table[row, prefix_len - 1].item() if prefix_len else -1
        slots = self.runner.memory.allocator.alloc_extend(last, prefix_len, len(ids))
        table.write(row, prefix_len, slots)
        self.held[row] = prefix_len + len(ids)
        return ExtendSlice(row, prefix_len, ids, slots)

    def _forward(self, slices: list[ExtendSlice]) -> torch.Tensor:
        batch = build_forward_batch(slices, self.runner.memory.req_to_token.table, self.runner.vocab_size)
        return self.runner.forward(batch)

    def run(self, batch: int, prompt: int, prefix: int, steps: int, seed: int) -> tuple[float, float]:
        """(prefill seconds, decode seconds) for `batch` requests."""
        gen = torch.Generator().manual_seed(seed)
        vocab = self.runner.vocab_size
        rows = [self.runner.memory.req_to_token.alloc() for _ in range(batch)]
        try:
            # Half the requests sit behind a cached prefix (written, not timed): extend with prefix hits.
            prefixes = [prefix if b % 2 else 0 for b in range(batch)]
            cached = [self._slice(r, 0, torch.randint(5, vocab, (p,), generator=gen).tolist())
                      for r, p in zip(rows, prefixes) if p]
            if cached:
                self._forward(cached)
            ids = [torch.randint(5, vocab, (prompt,), generator=gen).tolist() for _ in rows]
            start = self.clock()
            logits = self._forward([self._slice(r, p, i) for r, p, i in zip(rows, prefixes, ids)])
            prefill = self.clock() - start
            lens = [p + prompt for p in prefixes]
            start = self.clock()
            for step in range(steps):
                nxt = logits.argmax(-1).tolist()  # one host sync per step, as the engine's sampler
                logits = self._forward([self._slice(r, n + step, [t]) for r, n, t in zip(rows, lens, nxt)])
            decode = self.clock() - start
            return prefill, decode
        finally:
            for r in rows:
                self.runner.memory.allocator.free(self.runner.memory.req_to_token.read(r, 0, self.held.pop(r, 0)))
                self.runner.memory.req_to_token.free(r)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt", type=int, default=128, help="new prompt tokens per request")
    ap.add_argument("--prefix", type=int, default=128, help="cached prefix of every second request")
    ap.add_argument("--steps", type=int, default=16, help="decode steps")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default="before,after,after-bf16")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--model", help="checkpoint dir (default: BENCH_SPEC under /tmp/vlserve-bench-models/bench)")
    ap.add_argument("--out", default="benchmarks/results/per_token.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model or bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    names = args.configs.split(",")
    context = args.prefix + args.prompt + args.steps + 8
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    harnesses = {n: Harness(model_dir, CONFIGS[n], max(args.batches), context, clock) for n in names}
    for h in harnesses.values():  # warm-up: first calls build kernels and oneDNN primitives
        h.run(2, 16, 8, 2, seed=99)
    results = run_alternating(harnesses, args)
    text = report(results, args, names)
    write_report(args.out, text)
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)


def run_alternating(harnesses: dict[str, Harness], args) -> dict:
    """Each batch size on every configuration in turn (the order reversed every second repeat);
    tokens/s per configuration, batch size and phase."""
    names = list(harnesses)
    results = {n: {b: {"prefill": [], "decode": []} for b in args.batches} for n in names}
    for rep in range(args.repeats):
        for b in args.batches:
            for n in (names if rep % 2 == 0 else names[::-1]):
                prefill, decode = harnesses[n].run(b, args.prompt, args.prefix, args.steps, seed=rep)
                results[n][b]["prefill"].append(b * args.prompt / prefill)
                results[n][b]["decode"].append(b * args.steps / decode)
                print(f"rep {rep} B={b} {n}: prefill {results[n][b]['prefill'][-1]:.0f} tok/s, "
                      f"decode {results[n][b]['decode'][-1]:.1f} tok/s", flush=True)
    return results


def report(results: dict, args, names: list[str]) -> str:
    med = {n: {b: {k: statistics.median(v) for k, v in r.items()} for b, r in rs.items()} for n, rs in results.items()}
    head = (f"Per computed token, BENCH_SPEC, torch {torch.__version__}, {args.threads} threads, "
            f"{platform.processor() or platform.machine()} ({torch.backends.cpu.get_cpu_capability()}), "
            f"{args.clock} clock, "
            f"load average at the end {os.getloadavg()[0]:.1f}; prompt {args.prompt} new tokens "
            f"(every second request behind a cached {args.prefix}-token prefix), {args.steps} decode steps, "
            f"median of {args.repeats}.\n\n")
    cols = [f"{n} prefill tok/s" for n in names] + [f"{n} decode tok/s" for n in names]
    ratios = [n for n in names if n != "before"] if "before" in names else []
    cols += [f"{n}/before prefill" for n in ratios] + [f"{n}/before decode" for n in ratios]
    lines = ["| batch | " + " | ".join(cols) + " |", "| ---: | " + " | ".join("---:" for _ in cols) + " |"]
    for b in args.batches:
        cells = [f"{med[n][b]['prefill']:.0f}" for n in names] + [f"{med[n][b]['decode']:.1f}" for n in names]
        cells += [f"{med[n][b]['prefill'] / med['before'][b]['prefill']:.2f}x" for n in ratios]
        cells += [f"{med[n][b]['decode'] / med['before'][b]['decode']:.2f}x" for n in ratios]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
