"""Data-parallel routing, simulated over the real RadixCache (issue 17).

    python benchmarks/router.py [--out benchmarks/results]

Each worker is the engine's own RadixCache (vlserve/cache/radix_cache.py) over a pool of
--capacity KV slots (LRU eviction, the matched path locked while making room, as the engine does).
Requests arrive in waves of --concurrency; each wave is routed with the loads of that wave counted
(acquired when sent, released at the end of the wave), then each worker caches the request's prompt
and answer. Three routers:

- cache-aware: vlserve's router (vlserve/router/policy.py + tree.py) on the engine's key: text ids
  with each image's pseudo tokens (preprocess.pad_values of the image's hash);
- text-only: the same policy on the key a router that drops images sees (one image token instead of
  the picture), as SGLang's gateway, Ray's prefix-aware router and vLLM's production-stack router do;
- round robin.

The workload: --images pictures, each asked --questions questions (LLaVA-1.5: system prompt, 576
image tokens, a question from one shared list, a 32-token answer), in a random order. Hit rate =
Σ prompt tokens found in the chosen worker's cache / Σ prompt tokens; the optimum is one worker with
an unbounded cache. Load spread = the busiest worker's requests / the mean. Writes router.json,
router.md and router.png under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import dataclass

import torch

from vlserve.cache.radix_cache import RadixCache
from vlserve.preprocess import pad_values
from vlserve.router.policy import PolicyConfig, choose, record
from vlserve.router.tree import ApproxTree
from vlserve.router.worker import Worker

IMAGE_TOKEN = 32000
TOKENS_PER_IMAGE = 576
SYSTEM = list(range(1, 36))  # "A chat between a curious human and an artificial intelligence assistant. ..."


@dataclass
class Request:
    true_key: list[int]  # what the engine caches: the image as its pseudo tokens
    text_key: list[int]  # what an image-blind router sees
    answer: list[int]


def workload(images: int, questions: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    shared = list(range(100, 112))  # "Answer in one short sentence." before each question
    asked = [shared + [200 + 20 * q + i for i in range(14)] for q in range(questions)]
    out = []
    for img in range(images):
        pads = pad_values(img.to_bytes(16, "little"), TOKENS_PER_IMAGE)
        for q in range(questions):
            answer = [rng.randrange(1000, 30000) for _ in range(32)]
            out.append(Request(SYSTEM + pads + asked[q], SYSTEM + [IMAGE_TOKEN] + asked[q], answer))
    rng.shuffle(out)
    return out


class SimPool:
    """KV slots: a free list the radix tree returns slots to on eviction."""

    def __init__(self, capacity: int):
        self.free_slots = list(range(capacity))

    def alloc(self, n: int) -> torch.Tensor:
        taken, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return torch.tensor(taken, dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> None:
        self.free_slots.extend(indices.tolist())


class SimWorker:
    def __init__(self, capacity: int):
        self.pool = SimPool(capacity)
        self.cache = RadixCache(self.pool)
        self.requests = 0

    def serve(self, req: Request) -> int:
        """Prompt tokens found cached; then prompt + answer are cached (evicting LRU leaves as needed)."""
        self.requests += 1
        seq = req.true_key + req.answer
        match = self.cache.match_prefix(seq)
        hit = min(match.prefix_len, len(req.true_key))
        need = len(seq) - match.prefix_len
        self.cache.lock(match.node)
        if len(self.pool.free_slots) < need:
            self.cache.evict(need - len(self.pool.free_slots))
        self.cache.unlock(match.node)
        if len(self.pool.free_slots) >= need:
            self.cache.insert(seq, torch.cat([match.indices, self.pool.alloc(need)]))
        return hit


def simulate(router: str, requests: list[Request], n: int, capacity: int, concurrency: int) -> dict:
    sims = [SimWorker(capacity) for _ in range(n)]
    views = [Worker(f"w{i}", i, ApproxTree(capacity)) for i in range(n)]
    hit = prompt = 0
    for start in range(0, len(requests), concurrency):
        wave = requests[start:start + concurrency]
        chosen = []
        for i, req in enumerate(wave):
            if router == "round robin":
                chosen.append(views[(start + i) % n])
                continue
            key = req.true_key if router == "cache-aware" else req.text_key
            choice = choose(views, key, PolicyConfig())
            record(choice, key)
            choice.worker.acquire()
            chosen.append(choice.worker)
        for req, view in zip(wave, chosen):
            hit += sims[view.index].serve(req)
            prompt += len(req.true_key)
            if router != "round robin":
                view.release()
    counts = [s.requests for s in sims]
    return {"router": router, "workers": n, "hit_rate": hit / prompt, "requests_per_worker": counts,
            "load_spread": max(counts) / (sum(counts) / n)}


def optimum(requests: list[Request]) -> float:
    tree, hit = RadixCache(SimPool(0)), 0
    for req in requests:
        seq = req.true_key + req.answer
        hit += min(tree.peek_prefix_len(seq), len(req.true_key))
        tree.insert(seq, torch.zeros(len(seq), dtype=torch.int64))
    return hit / sum(len(r.true_key) for r in requests)


def plot(results: list[dict], best: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routers = ["cache-aware", "text-only", "round robin"]
    sizes = sorted({r["workers"] for r in results})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(routers)
    for j, name in enumerate(routers):
        rows = [next(r for r in results if r["router"] == name and r["workers"] == n) for n in sizes]
        xs = [i + j * width for i in range(len(sizes))]
        axes[0].bar(xs, [r["hit_rate"] for r in rows], width, label=name)
        axes[1].bar(xs, [r["load_spread"] for r in rows], width, label=name)
    axes[0].axhline(best, color="gray", linestyle="--", label="one unbounded cache")
    axes[0].set_ylabel("prompt cache hit rate")
    axes[1].set_ylabel("busiest worker's requests / mean")
    axes[1].axhline(1.0, color="gray", linestyle=":")
    for ax in axes:
        ax.set_xticks([i + width for i in range(len(sizes))], [f"{n} workers" for n in sizes])
    axes[0].legend(fontsize=8)
    fig.suptitle("Routing over the real RadixCache: images x questions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: list[dict], best: float, args) -> str:
    lines = [f"Workload: {args.images} images x {args.questions} questions ({args.images * args.questions} requests, "
             f"prompt {len(SYSTEM) + TOKENS_PER_IMAGE + 26} tokens), waves of {args.concurrency}, "
             f"{args.capacity} KV slots per worker, seed {args.seed}. One worker with an unbounded cache: "
             f"hit rate {best:.3f}.", "",
             "| workers | router | hit rate | of the optimum | requests per worker | load spread (max/mean) |",
             "| ---: | --- | ---: | ---: | --- | ---: |"]
    for r in results:
        lines.append(f"| {r['workers']} | {r['router']} | {r['hit_rate']:.3f} | {r['hit_rate'] / best:.0%} | "
                     f"{r['requests_per_worker']} | {r['load_spread']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--capacity", type=int, default=8192, help="KV slots per worker")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    requests = workload(args.images, args.questions, args.seed)
    best = optimum(requests)
    results = [simulate(router, requests, n, args.capacity, args.concurrency)
               for n in (2, 4) for router in ("cache-aware", "text-only", "round robin")]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "router.json"), "w") as f:
        json.dump({"args": vars(args), "optimum": best, "results": results}, f, indent=1)
    with open(os.path.join(args.out, "router.md"), "w") as f:
        f.write(table(results, best, args))
    plot(results, best, os.path.join(args.out, "router.png"))
    print(table(results, best, args))


if __name__ == "__main__":
    main()
