"""The two halves of a picture question, each against vLLM-CPU in the same run: requests that are
only a picture (its own each, a few words, one new token: the vision tower plus a short prefill) and
requests that are only text of about the same length as a picture question's prompt (the decoder's
prefill alone). Where the workloads benchmark shows a ratio near 1, this says which half is level.

    python benchmarks/workloads.py ...   # the workloads themselves
    python benchmarks/tower_and_prefill.py --spec qwen2-0.5b-siglip --dtype float32 [--requests 4]

Both systems go through the workloads harness (benchmarks/workloads.py: its vLLM settings, its KV
space, caches emptied before each of --batches timed batches, the fastest reported); every request
has nothing to share with another (distinct pictures, distinct texts).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workloads as WL  # noqa: E402  (benchmarks/ is not a package)

from vlserve.bench import workload_defs as W  # noqa: E402
from vlserve.bench.client import Job  # noqa: E402
from vlserve.bench.harness import bench_parser, threads_from  # noqa: E402
from vlserve.bench.models import SPECS, bench_model  # noqa: E402

SYSTEMS = ("vlserve-lpm", "vllm")


def picture_jobs(n: int) -> list[Job]:
    """n distinct pictures, drawn as the workloads draw theirs (the model's processor resizes them)."""
    return [Job("USER: <image>\nWhat is it? ASSISTANT:", [W.scene_png(1000 + i)], [], max_new_tokens=1,
                ignore_eos=True) for i in range(n)]


def text_jobs(n: int, words: int) -> list[Job]:
    return [Job("USER: " + " ".join(W.WORDS[(i + j) % len(W.WORDS)] for j in range(words)) + " ASSISTANT:", [], [],
                max_new_tokens=1, ignore_eos=True) for i in range(n)]


def main(argv=None) -> int:
    ap = bench_parser(__doc__.split("\n\n")[0], "benchmarks/results/tower_and_prefill.md")
    ap.add_argument("--spec", choices=sorted(SPECS), default="qwen2-0.5b-siglip")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--requests", type=int, default=4, help="requests per half")
    ap.add_argument("--words", type=int, default=520, help="words of each text-only prompt")
    ap.add_argument("--batches", type=int, default=2)
    args = ap.parse_args(argv)
    threads = threads_from(args)
    model = bench_model(f"/tmp/vlserve-bench-models/{args.spec}", SPECS[args.spec])
    peers = WL.PeerOptions()
    rows = []
    for label, jobs in (("pictures", picture_jobs(args.requests)), ("text", text_jobs(args.requests, args.words))):
        walls = {}
        for system in SYSTEMS:
            run, _ = WL._run_system(system, model, jobs, threads, peers, args.dtype, lambda: 0.0, args.batches)
            walls[system] = (run.wall_s, sum(run.prompt_tokens))
            print(f"[{label}] {system}: {run.wall_s:.2f} s", file=sys.stderr, flush=True)
        (ours, tokens), (theirs, _) = walls["vlserve-lpm"], walls["vllm"]
        rows.append(f"| {label} | {args.requests} | {tokens} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f}x |")
    report = "\n".join([
        f"{args.spec}, {args.dtype}, {threads} threads, fastest of {args.batches} batches, one new token a request.",
        "",
        "| half | requests | prompt tokens | vlserve s | vLLM s | vLLM s / vlserve s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |", *rows, ""])
    print(report)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
