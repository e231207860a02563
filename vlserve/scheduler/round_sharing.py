"""In-batch prefix sharing: new requests of one admission round that share a prefix the cache lacks.

The radix cache shares KV between rounds; inside one round, two new requests with the same uncached
prefix (24 questions after one few-shot header, six questions on one new picture) would both
compute it. The first one admitted (the leader) computes it. A later one (a follower) whose shared
part lies inside the leader's planned extend borrows the leader's slots for those positions and
joins the same forward, computing only its own tokens: each layer writes every new token's K/V to
the pool before any of its attention reads, so the follower's queries see the leader's keys of that
very layer. After the forward the leader's KV is in the tree and the follower locks it like any
cached prefix (CacheManager.settle). No extra round, no lagging request, the shared part computed
once.

Where the shared part is not inside a leader's planned extend (it lies in a later chunk of the
leader's chunked prefill, or in a prompt still in chunked prefill from an earlier round, or where
the follower asks for prompt logprobs, whose logits are its own), the follower waits a round and
hits the cache then, as SGLang deprioritises it. Requests sharing fewer than threshold_tokens
uncached tokens compute them themselves; an overdue request (aging) never waits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlserve.cache.radix_cache import key_trie
from vlserve.core.request import Req

_NOT_A_LEADER = -1  # trie value of a prompt still in chunked prefill: it lends nothing this step


@dataclass(frozen=True)
class Borrow:
    """The follower's positions [its kv_len, end) use the leader's slots for them."""
    leader: Req
    end: int


class RoundSharing:
    """One admission round's view of what its requests will compute: add() each planned extend; for the
    next request, lender() says whom it can borrow from, else must_wait() whether it waits a round
    (if neither, it computes the shared tokens itself)."""

    def __init__(self, threshold_tokens: int, page_size: int = 1, in_flight: list[list[int]] = ()):
        if threshold_tokens < 1:
            raise ValueError(f"threshold_tokens must be >= 1, got {threshold_tokens}")
        self.threshold, self.page_size = threshold_tokens, page_size
        self._trie = key_trie()
        self._leaders: list[tuple[Req, int]] = []  # (request, end of its planned extend)
        for key in in_flight:  # prompts still being prefilled (chunked): their KV is on its way
            self._trie.insert(key, torch.full((len(key),), _NOT_A_LEADER))

    def lender(self, req: Req, cached: int) -> Borrow | None:
        """For req with `cached` positions already mapped (its cache hit): the leader whose planned
        extend covers at least threshold_tokens of req's next positions, and how far; None where
        there is none."""
        match = self._trie.match_prefix(req.seq)
        if match.prefix_len - cached < self.threshold:
            return None
        index = int(match.indices[match.prefix_len - 1])
        if index == _NOT_A_LEADER:
            return None
        leader, planned_end = self._leaders[index]
        if match.prefix_len - planned_end >= self.threshold:
            return None  # the rest of the shared part comes in the leader's next chunk: wait for all of it
        end = min(match.prefix_len, planned_end, req.seq_len - 1)  # req computes at least its last token
        if req.return_logprob and req.logprob_start_len >= 0:  # and the logits scoring its prompt from there
            end = min(end, req.logprob_start_len - 1)
        end = end // self.page_size * self.page_size  # its own slots start on a fresh page
        if cached < leader.tree_len or end - cached < self.threshold:
            return None  # the leader's row holds tree slots there, or too little is left to share
        return Borrow(leader, end)

    def must_wait(self, req: Req, cached: int) -> bool:
        """Whether req shares threshold_tokens or more past its cache hit with this round's prompts
        (so, where it cannot borrow them, it should wait a round for them)."""
        return self._trie.peek_prefix_len(req.seq) - cached >= self.threshold

    def add(self, req: Req, planned_end: int) -> None:
        """req extends to planned_end this step: a leader for the requests after it."""
        self._trie.insert(req.seq, torch.full((len(req.seq),), len(self._leaders)))
        self._leaders.append((req, planned_end))
