"""An approximate radix tree of what one worker has cached, with an LRU size cap.

It is the engine's own RadixCache (vlserve/cache/radix_cache.py) over keys only: the router holds no
KV, so every "slot" is a dummy and eviction frees nothing. It is approximate because the router
inserts a request's prompt when it sends it, while the worker caches it (and the answer) once
computed and evicts under its own memory pressure; the cap in tokens stands in for the worker's pool.
"""

from dataclasses import dataclass, field

import torch

from vlserve.cache.radix_cache import RadixCache


class _NoSlots:
    def free(self, indices: torch.Tensor) -> None:  # the router's trees own no KV slots
        pass


@dataclass
class ApproxTree:
    max_tokens: int
    cache: RadixCache = field(init=False)

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        self.cache = RadixCache(_NoSlots())

    def match_len(self, key: list[int]) -> int:
        """Tokens of key this worker likely has cached (touches nothing)."""
        return self.cache.peek_prefix_len(key)

    def insert(self, key: list[int]) -> None:
        """Records key as cached here (and as just used), then evicts least recently used leaves
        down to the cap."""
        self.cache.insert(key, torch.zeros(len(key), dtype=torch.int64))
        over = self.cache.total_size() - self.max_tokens
        if over > 0:
            self.cache.evict(over)

    def size(self) -> int:
        return self.cache.total_size()

    def clear(self) -> None:
        self.cache.reset()
