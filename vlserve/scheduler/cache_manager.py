"""Glue between requests, the radix cache and the slot allocator: who owns which KV slot.

A running request's positions 0..kv_len-1 have slots in its req_to_token row. The first
tree_len of them belong to the radix tree (the path of its locked last_node); the rest are the
request's own until it hands them to the tree (insert) or frees them — except, for the one step
between admission and process, a `borrowed` range right after tree_len: slots of another request
of the same step that computes those positions (in-batch sharing, round_sharing.py), which the
borrower never frees or inserts; settle() turns them into a lock on the tree's copy. Pool accounting
(docs/ARCHITECTURE.md, invariant 1): free + tree tokens + request-owned tokens == capacity; when
idle, free + tree == capacity. Only this class writes a request's KV fields (req_row, kv_len,
tree_len, borrowed, last_node, cached_tokens).
"""

import torch

from vlserve.cache.radix_cache import RadixCache
from vlserve.core.request import Req
from vlserve.memory.allocator import OutOfSlots
from vlserve.memory.pools import KVMemory


class CacheManager:
    def __init__(self, memory: KVMemory, disable_radix_cache: bool = False):
        self.allocator = memory.allocator
        self.rows = memory.req_to_token
        self.page_size = self.allocator.page_size
        self.cache = RadixCache(self.allocator, self.page_size, disabled=disable_radix_cache)

    # ---- accounting ---------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    def available_slots(self) -> int:
        """Slots a new allocation can get: free ones plus what eviction could free."""
        return self.allocator.num_free_slots + self.cache.evictable_size()

    def pool_state(self) -> dict[str, int]:
        free, cached = self.allocator.num_free_slots, self.cache.evictable_size()
        return {"free": free, "cached": cached, "in_use": self.capacity - free - cached}

    def check_idle_accounting(self) -> None:
        free, tree = self.allocator.num_free_slots, self.cache.total_size()
        assert self.cache.protected_size() == 0, f"{self.cache.protected_size()} tokens still locked while idle"
        assert free + tree == self.capacity, f"leak: free {free} + cached {tree} != capacity {self.capacity}"

    # ---- admission ----------------------------------------------------------------------------
    def admit(self, req: Req) -> bool:
        """Takes a req_to_token row and locks the longest cached prefix. False when no row is free."""
        row = self.rows.alloc()
        if row is None:
            return False
        req.req_row = row
        limit = req.seq_len - 1  # at least one token is computed: its logits are needed
        if req.return_logprob and req.logprob_start_len >= 0:
            limit = min(limit, req.logprob_start_len - 1)  # the logits at p-1 score the token at p
        match = self.cache.match_prefix(req.seq[:max(0, limit)])
        self.cache.lock(match.node)
        req.last_node, req.kv_len, req.tree_len = match.node, match.prefix_len, match.prefix_len
        if match.prefix_len:
            self.rows.write(row, 0, match.indices)
        if req.cached_tokens < 0:
            req.cached_tokens = match.prefix_len
        return True

    def borrow(self, req: Req, leader: Req, end: int) -> None:
        """Right after admit: req's positions [kv_len, end) take leader's slots, which leader's extend in
        this step computes (leader is planned before req, and processed before it)."""
        start = req.kv_len
        self.rows.write(req.req_row, start, self.rows.read(leader.req_row, start, end))
        req.borrowed, req.kv_len = (start, end), end
        if req.admit_time is None:  # first admission: the borrowed prompt tokens are not computed for it
            req.cached_tokens = end

    def settle(self, req: Req) -> bool:
        """After the step that computed req's borrowed range: req locks the tree's copy of it, as of a
        cached prefix. False when the tree lacks it (the leader's forward failed): then req's KV
        from the borrowed range on is dropped (its own slots freed)."""
        if req.borrowed is None:
            return True
        start, end = req.borrowed
        req.borrowed = None
        match = self.cache.match_prefix(req.seq[:end])
        if match.prefix_len < end:
            self.allocator.free(self.rows.read(req.req_row, end, req.kv_len))
            req.kv_len = start
            return False
        self.rows.write(req.req_row, 0, match.indices)  # the tree may hold a copy other than the leader's
        self.cache.lock(match.node)
        self.cache.unlock(req.last_node)
        req.last_node, req.tree_len = match.node, end
        return True

    def alloc(self, req: Req, n: int) -> torch.Tensor:
        """Slots for req's next n positions, evicting unlocked cache leaves if needed."""
        need = self.allocator.slots_needed(req.kv_len, n)
        short = need - self.allocator.num_free_slots
        if short > 0:
            self.cache.evict(short)
        partial_page = self.page_size > 1 and req.kv_len % self.page_size
        last = int(self.rows.table[req.req_row, req.kv_len - 1]) if partial_page else -1
        slots = self.allocator.alloc_extend(last, req.kv_len, n)  # raises OutOfSlots
        self.rows.write(req.req_row, req.kv_len, slots)
        return slots

    def advance(self, req: Req, n: int) -> None:
        """The forward computed KV for the n positions alloc() gave req."""
        req.kv_len += n

    def drop_uncomputed(self, req: Req, n: int) -> None:
        """The forward for the n positions alloc() gave req failed: free their fresh pages."""
        if req.req_row is None:
            return
        computed = req.kv_len
        req.kv_len += n
        self.rewind(req, computed)
        if req.borrowed is not None:  # the lender's KV failed with it
            req.kv_len, req.borrowed = req.borrowed[0], None

    # ---- handing KV to the tree -----------------------------------------------------------------
    def cache_prefix(self, req: Req) -> None:
        """After a prefill: put seq[:kv_len] in the tree so later arrivals share it while req decodes."""
        if self.cache.disabled:
            return
        self.settle(req)
        aligned = self._insert(req)
        match = self.cache.match_prefix(req.seq[:aligned])
        self.rows.write(req.req_row, 0, match.indices)
        self.cache.lock(match.node)
        self.cache.unlock(req.last_node)
        req.last_node, req.tree_len = match.node, aligned

    def release(self, req: Req) -> None:
        """Finish, abort or retract: computed KV goes to the tree (or is freed), locks and row released."""
        if req.req_row is None:
            return
        self.settle(req)
        if self.cache.disabled:
            self.allocator.free(self.rows.read(req.req_row, req.tree_len, req.kv_len))
        else:
            aligned = self._insert(req)
            self.allocator.free(self.rows.read(req.req_row, aligned, req.kv_len))  # partial last page
        self.cache.unlock(req.last_node)
        self.rows.free(req.req_row)
        req.req_row, req.last_node, req.kv_len, req.tree_len = None, None, 0, 0

    def rewind(self, req: Req, new_kv_len: int) -> None:
        """Drops KV of positions >= new_kv_len (jump-forward retokenisation); they must be req's own."""
        assert new_kv_len >= req.tree_len, "cannot rewind into tree-owned KV"
        p = self.page_size
        first_free = -(-new_kv_len // p) * p  # keep the page holding position new_kv_len-1
        if first_free < req.kv_len:
            self.allocator.free(self.rows.read(req.req_row, first_free, req.kv_len))
        req.kv_len = new_kv_len

    def _insert(self, req: Req) -> int:
        """Inserts seq[:kv_len] (whole pages); frees req's slots the tree already had. Returns the
        inserted length; the tree owns [0, that) afterwards."""
        aligned = req.kv_len // self.page_size * self.page_size
        slots = self.rows.read(req.req_row, 0, aligned)
        already = self.cache.insert(req.seq[:aligned], slots)
        self.allocator.free(slots[req.tree_len:already])  # duplicates: the tree keeps its own slots
        return aligned


__all__ = ["CacheManager", "OutOfSlots"]
