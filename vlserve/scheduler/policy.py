"""Order of the waiting queue (SGLang paper §3, Theorem 3.1). In-batch prefix sharing: round_sharing.py.

Policies:
- "lpm": longest cached prefix first. Processing requests one at a time in this order, inserting
  each into the cache, visits the radix tree of the requests depth first (Theorem 3.1).
- "dfs-weight": weight each node of the cached tree by the waiting requests under it and walk it
  depth first, heavier children first; a node's own requests follow its children.
- "fcfs": arrival order. "random": a seeded shuffle.

Aging (all policies): a request that has waited more than max_wait_steps scheduling steps goes
first, oldest first, so lpm cannot starve a request with no cache hit. The caller advances the
clock with step() once per scheduling step and stamps arrivals with `now_step`.

Cost bound (lpm, dfs-weight): only the oldest `max_match_candidates` non-overdue requests are
matched and reordered; the rest follow in arrival order with matched_len 0. Matching is a read-only
peek (no split, no recency change), O(depth) Python steps per request, so the default of 1024 is
cheap; this keeps cache-aware ordering for a large queue's head where SGLang falls back to fcfs.

Ties always go to the earlier arrival.
"""

from __future__ import annotations

import random
from typing import Protocol

import torch

from vlserve.cache.radix_cache import RadixCache, TreeNode, key_trie
from vlserve.core.config import SCHEDULE_POLICIES, EngineArgs


class WaitingReq(Protocol):
    seq: list[int]  # the full radix key so far (prompt, pseudo tokens, output)
    arrival_step: int
    matched_len: int  # written by lpm and dfs-weight: cached prefix length


def _insert_key(trie: RadixCache, key: list[int]) -> None:
    trie.insert(key, torch.zeros(len(key), dtype=torch.int64))


class SchedulePolicy:
    def __init__(
        self,
        name: str,
        cache: RadixCache,
        max_wait_steps: int = EngineArgs.max_wait_steps,
        seed: int = 0,
        max_match_candidates: int = 1024,
    ):
        if name not in SCHEDULE_POLICIES:
            raise ValueError(f"unknown schedule policy {name!r}; allowed: {', '.join(SCHEDULE_POLICIES)}")
        if max_wait_steps < 0:
            raise ValueError(f"max_wait_steps must be >= 0, got {max_wait_steps}")
        if max_match_candidates < 1:
            raise ValueError(f"max_match_candidates must be >= 1, got {max_match_candidates}")
        self.name = name
        self.cache = cache
        self.max_wait_steps = max_wait_steps
        self.max_match_candidates = max_match_candidates
        self.now_step = 0
        self._rng = random.Random(seed)

    def step(self) -> int:
        """Advances the scheduling clock by one step; returns the new step."""
        self.now_step += 1
        return self.now_step

    def is_overdue(self, req: WaitingReq) -> bool:
        return self.now_step - req.arrival_step > self.max_wait_steps

    def order(self, waiting: list[WaitingReq]) -> list[WaitingReq]:
        by_arrival = sorted(waiting, key=lambda r: r.arrival_step)  # stable: input order breaks ties
        overdue = [r for r in by_arrival if self.is_overdue(r)]
        rest = [r for r in by_arrival if not self.is_overdue(r)]
        if self.name == "fcfs":
            return overdue + rest
        if self.name == "random":
            self._rng.shuffle(rest)
            return overdue + rest
        for req in overdue:
            req.matched_len = self.cache.peek_prefix_len(req.seq)
        head, tail = rest[: self.max_match_candidates], rest[self.max_match_candidates :]
        for req in head:
            req.matched_len = self.cache.peek_prefix_len(req.seq)
        for req in tail:
            req.matched_len = 0
        if self.name == "lpm":
            head = sorted(head, key=lambda r: -r.matched_len)
        else:
            head = _dfs_weight_order(head)
        return overdue + head + tail


def _dfs_weight_order(reqs: list[WaitingReq]) -> list[WaitingReq]:
    """Depth-first walk over the tree of the requests' cached prefixes, heavier subtrees first.

    The walk runs on a private trie of those prefixes, so the real cache is neither split nor
    touched. reqs come in arrival order; position breaks weight ties."""
    trie = key_trie()
    for req in reqs:
        _insert_key(trie, req.seq[: req.matched_len])
    ends: dict[TreeNode, list[WaitingReq]] = {}
    for req in reqs:
        ends.setdefault(trie.match_prefix(req.seq[: req.matched_len]).node, []).append(req)

    preorder = [trie.root, *trie.iter_nodes()]
    weight = {node: len(ends.get(node, ())) for node in preorder}
    position = {id(req): i for i, req in enumerate(reqs)}
    first = {node: position[id(ends[node][0])] if node in ends else len(reqs) for node in preorder}
    for node in reversed(preorder):  # children before parents
        if node is not trie.root:
            weight[node.parent] += weight[node]
            first[node.parent] = min(first[node.parent], first[node])

    ordered: list[WaitingReq] = []
    stack: list[tuple[TreeNode, bool]] = [(trie.root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            ordered.extend(ends.get(node, ()))
            continue
        stack.append((node, True))
        children = sorted(node.children.values(), key=lambda c: (-weight[c], first[c]))
        stack.extend((child, False) for child in reversed(children))
    return ordered
