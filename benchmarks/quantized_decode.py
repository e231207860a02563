"""Quantized checkpoints against bf16 on the CPU: prefill and decode tokens/s of the same model as
bf16, W8A8-int8 and W4A16, each checkpoint written by llm-compressor (vlserve/testing/
quantize_checkpoint.py, in .venv-llmc) from one bf16 random-weight LLaVA whose decoder weighs a few
hundred MB, so that decode streams weights.

Each configuration drives the ModelRunner directly (benchmarks/per_token.py's Harness): prefill is
one request of --prefill-prompt tokens in one forward; decode at batch B is B requests of 16 tokens,
then --steps forwards of B tokens. Configurations run in turn, in alternating order, --repeats
times; the table gives medians and the ratios to bf16 from the same run. --clock cpu times with the
process's CPU time (use it with --threads 1 on a machine shared with other jobs: the wall clock then
counts the time other jobs hold the cores).

    python benchmarks/quantized_decode.py --threads 2 --out benchmarks/results/quantized_decode.md
    python benchmarks/quantized_decode.py --threads 1 --clock cpu --out benchmarks/results/quantized_decode_cpu1.md
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from per_token import Harness
from vlserve.bench.models import num_parameters
from vlserve.bench.report import write_report
from vlserve.core.config import KernelConfig
from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Llama decoder hidden 1536, intermediate 4096, 8 layers: 199 M decoder parameters, 398 MB in bf16.
QUANT_BENCH_SPEC = TinyModelSpec(
    vocab_size=4000, hidden_size=1536, intermediate_size=4096, num_layers=8, num_heads=12, num_kv_heads=4,
    vision_hidden=256, vision_intermediate=1024, vision_layers=2, vision_heads=4, image_size=224, patch_size=14,
    max_position_embeddings=4096, dtype="bfloat16")
DECODE_PROMPT = 16  # each decode request's prompt: decode steps then read a short context
SCHEMES = {"w8a8": ["--scheme", "w8a8"], "w4a16": ["--scheme", "w4a16", "--group-size", "128"]}


def checkpoints(root: str) -> dict[str, str]:
    """bf16 and each scheme's compressed checkpoint under root, written once."""
    paths = {"bf16": os.path.join(root, "bf16")}
    if not os.path.exists(os.path.join(paths["bf16"], "config.json")):
        make_tiny_model(paths["bf16"], seed=0, spec=QUANT_BENCH_SPEC)
    llmc = os.path.join(os.environ.get("VLSERVE_LLMC_VENV", os.path.join(ROOT, ".venv-llmc")), "bin", "python")
    for name, flags in SCHEMES.items():
        paths[name] = os.path.join(root, name)
        if not os.path.exists(os.path.join(paths[name], "config.json")):
            subprocess.run([llmc, os.path.join(ROOT, "vlserve", "testing", "quantize_checkpoint.py"), paths["bf16"],
                            paths[name], *flags], check=True)
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prefill-prompt", type=int, default=256, help="tokens of the prefill measurement's prompt")
    ap.add_argument("--steps", type=int, default=32, help="decode steps")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--root", default="/tmp/vlserve-bench-models/quantized")
    ap.add_argument("--out", default="benchmarks/results/quantized_decode.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    paths = checkpoints(args.root)
    names = list(paths)
    context = max(args.prefill_prompt, DECODE_PROMPT + args.steps) + 8
    config = {"kernels": KernelConfig(), "attention": "torch", "dtype": "bfloat16"}
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    harnesses = {n: Harness(paths[n], config, max(args.batches), context, clock) for n in names}
    for h in harnesses.values():  # warm-up: first calls build kernels and oneDNN primitives
        h.run(2, 16, 0, 2, seed=99)
    results = {n: {"prefill": [], **{b: [] for b in args.batches}} for n in names}
    for rep in range(args.repeats):
        for n in (names if rep % 2 == 0 else names[::-1]):
            prefill, _ = harnesses[n].run(1, args.prefill_prompt, 0, 0, seed=rep)
            results[n]["prefill"].append(args.prefill_prompt / prefill)
            print(f"rep {rep} {n}: prefill {results[n]['prefill'][-1]:.0f} tok/s", flush=True)
        for b in args.batches:
            for n in (names if rep % 2 == 0 else names[::-1]):
                _, decode = harnesses[n].run(b, DECODE_PROMPT, 0, args.steps, seed=rep)
                results[n][b].append(b * args.steps / decode)
                print(f"rep {rep} B={b} {n}: decode {results[n][b][-1]:.1f} tok/s", flush=True)
    write_report(args.out, report(results, args, names, num_parameters(paths["bf16"])))


def report(results: dict, args, names: list[str], params: int) -> str:
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    head = (f"Quantized vs bf16, {params / 1e6:.0f} M parameters (QUANT_BENCH_SPEC), torch {torch.__version__}, "
            f"{args.threads} threads, {platform.processor() or platform.machine()} "
            f"({torch.backends.cpu.get_cpu_capability()}), {args.clock} clock, load average at the end "
            f"{os.getloadavg()[0]:.1f}; prefill: one {args.prefill_prompt}-token prompt; decode: "
            f"{args.steps} steps of B requests; median of {args.repeats}. "
            f"Command: {' '.join(['python'] + sys.argv)}\n\n")
    quant = [n for n in names if n != "bf16"]
    rows = ["prefill"] + list(args.batches)
    cols = [f"{n} tok/s" for n in names] + [f"{n}/bf16" for n in quant]
    lines = ["| | " + " | ".join(cols) + " |", "| --- | " + " | ".join("---:" for _ in cols) + " |"]
    for r in rows:
        label = f"prefill ({args.prefill_prompt} tokens)" if r == "prefill" else f"decode, batch {r}"
        cells = [f"{med[n][r]:.1f}" for n in names] + [f"{med[n][r] / med['bf16'][r]:.2f}x" for n in quant]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
