"""The three memory objects of one engine, made together: slot allocator, KV pool, req_to_token.

The runner's model reads and writes KV through `kv` and `req_to_token`; the scheduler's cache
manager decides which slots each request owns through `allocator` and `req_to_token`.
"""

import os
from dataclasses import dataclass

import torch

from vlserve.core.config import MemoryConfig
from vlserve.memory.allocator import SlotAllocator
from vlserve.memory.kv_pool import KVPool
from vlserve.memory.req_to_token import ReqToTokenPool


@dataclass(frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_slot(self) -> int:
        return KVPool.bytes_per_slot(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)


@dataclass
class KVMemory:
    allocator: SlotAllocator
    kv: KVPool
    req_to_token: ReqToTokenPool
    context_len: int

    @classmethod
    def create(cls, shape: KVShape, cfg: MemoryConfig, device: str | torch.device = "cpu") -> "KVMemory":
        num_pages = max(1, cfg.max_total_tokens // cfg.page_size)
        kv = KVPool.create(shape.num_layers, num_pages * cfg.page_size, shape.num_kv_heads, shape.head_dim,
                           shape.dtype, device)
        return cls(SlotAllocator(num_pages, cfg.page_size), kv,
                   ReqToTokenPool(cfg.max_running_requests, cfg.context_length, device), cfg.context_length)


def default_max_total_tokens(shape: KVShape, fraction: float, cap: int = 1 << 18) -> int:
    """Sizes the pool as `fraction` of available memory (CUDA free memory, else host RAM), at most
    `cap` tokens (--max-total-tokens sets any size)."""
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(max(1024, min(cap, free * fraction // shape.bytes_per_slot)))
