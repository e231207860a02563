"""Prompt cache hit rate against the optimum, each workload submitted as one batch (issue 3).

    python benchmarks/cache_hit_rate.py [--spec small|bench] [--policy lpm] [--out benchmarks/results/cache_hit_rate.md]

hit rate = Σ cached_tokens / Σ prompt tokens (meta_info); optimum = (Σ prompt − union trie of the
requests' token ids, pseudo-token ids for images) / Σ prompt (vlserve.bench.workload_defs.optimal_hit_rate).
Target: hit rate >= 99% of the optimum on each workload.

Where the engine computes more than the union trie, the excess is attributed request by request:
requests are replayed into a trie in the order their prefill finished (the step that sampled their
first token; one step = one round) and each request's computed tokens beyond the trie nodes it adds
are its missed tokens, classified as
- "last token": the whole prompt was cached already but the engine computes >= 1 token (its logits);
- "same round": it shares an uncached prefix with a request prefilled in the same round (in-batch
  sharing reuses, or waits for, only prefixes of >= prefix_share_threshold tokens);
- "other": the cache held the prefix when the request's prefill finished, yet the request did not
  get it (e.g. it was admitted while the request that computes the prefix was still on an earlier
  chunk of a chunked prefill before that chunk was inserted into the tree).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections import defaultdict

from vlserve.bench import workload_defs as W
from vlserve.bench.client import Job
from vlserve.bench.models import BENCH_SPEC, SMALL_SPEC, bench_model
from vlserve.bench.report import write_report

WORKLOADS = ("few_shot", "tree_of_thought", "multi_turn_chat", "questions_per_image", "video_qa")


def run_batch(engine, reqs: list[Job]):
    made = [engine.make_request(prompt=r.prompt, image_data=r.images or None, video_data=r.videos or None,
                                sampling_params={"max_new_tokens": r.max_new_tokens, "temperature": 0,
                                                 "ignore_eos": True}) for r in reqs]
    done = [threading.Event() for _ in made]
    for req, ev in zip(made, done):
        req.sink = (lambda e: (lambda out: e.set() if out.finished else None))(ev)
    engine.submit(made)
    for ev in done:
        ev.wait()
    return made


def attribute_misses(made) -> dict:
    """Replays requests in prefill order into a trie; classifies tokens computed beyond the trie."""
    order = sorted(range(len(made)), key=lambda i: (made[i].first_token_time, i))
    root, rounds = {}, defaultdict(list)
    for i in order:
        rounds[made[i].first_token_time].append(i)
    out = {"last token": 0, "same round": 0, "other": 0, "details": []}
    for t in sorted(rounds):
        seen_before = _copy_depths(root, [made[i].input_ids for i in rounds[t]])
        for i in rounds[t]:
            ids, cached = made[i].input_ids, made[i].cached_tokens
            new = _insert(root, ids)
            computed = len(ids) - cached
            missed = computed - new
            if missed <= 0:
                continue
            known = seen_before[rounds[t].index(i)]
            if cached < min(known, len(ids) - 1):
                kind = "other"  # the cache held more than the request got
            elif known == len(ids):
                kind = "last token"
            else:
                kind = "same round"
            out[kind] += missed
            out["details"].append({"request": i, "prompt": len(ids), "cached": cached, "missed": missed,
                                   "cached_before_round": known, "kind": kind})
    return out


def _copy_depths(root: dict, seqs: list[list[int]]) -> list[int]:
    """How much of each sequence the trie held before this round (what the cache could give)."""
    depths = []
    for seq in seqs:
        node, d = root, 0
        for tok in seq:
            if tok not in node:
                break
            node, d = node[tok], d + 1
        depths.append(d)
    return depths


def _insert(root: dict, seq: list[int]) -> int:
    node, new = root, 0
    for tok in seq:
        if tok not in node:
            node[tok] = {}
            new += 1
        node = node[tok]
    return new


def main(argv: list[str] | None = None) -> int:
    import torch

    from vlserve import Engine

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", choices=("small", "bench"), default="small")
    p.add_argument("--policy", default="lpm")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunked-prefill-size", type=int, default=2048, help="the engine's prefill chunk")
    p.add_argument("--prefix-share-threshold", type=int, default=4, help="the engine's in-batch sharing threshold")
    p.add_argument("--out", default="benchmarks/results/cache_hit_rate.md")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = bench_model(f"/tmp/vlserve-bench-models/{args.spec}", BENCH_SPEC if args.spec == "bench" else SMALL_SPEC)
    rows = ["| workload | requests | Σ prompt | Σ cached | hit rate | optimum | of optimum "
            "| missed tokens (last token / same round / other) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    notes = []
    for name in args.workloads.split(","):
        reqs = W.WORKLOADS[name]()
        for r in reqs:
            r.max_new_tokens = 4
        with Engine(model, schedule_policy=args.policy, num_threads=args.threads,
                    prefix_share_threshold=args.prefix_share_threshold,
                    chunked_prefill_size=args.chunked_prefill_size) as engine:
            made = run_batch(engine, reqs)
        prompt = sum(len(r.input_ids) for r in made)
        cached = sum(r.cached_tokens for r in made)
        opt = W.optimal_hit_rate([r.input_ids for r in made])
        hit = cached / prompt
        miss = attribute_misses(made)
        rows.append(f"| {name} | {len(made)} | {prompt} | {cached} | {hit:.4f} | {opt:.4f} | {hit / opt:.2%} "
                    f"| {miss['last token']} / {miss['same round']} / {miss['other']} |")
        print(rows[-1], flush=True)
        for d in miss["details"]:
            notes.append(f"- {name}: request {d['request']} ({d['prompt']} prompt tokens) got {d['cached']} cached; "
                         f"{d['cached_before_round']} were in the cache before its round; "
                         f"{d['missed']} missed ({d['kind']})")
    command = "python benchmarks/cache_hit_rate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"Command: `{command}`\n\n"
            + "\n".join(rows) + "\n\n" + ("Missed tokens, request by request:\n\n" + "\n".join(notes) if notes else
                                           "No missed tokens.") + "\n")
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
