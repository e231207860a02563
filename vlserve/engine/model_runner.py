"""Owns the model and its memory: the KV pool, the req_to_token table, the slot allocator."""

from dataclasses import dataclass

import torch

from vlserve.memory.allocator import SlotAllocator
from vlserve.memory.kv_pool import KVPool
from vlserve.memory.req_to_token import ReqToTokenPool
from vlserve.model.attention import AttentionBackend
from vlserve.model.forward_batch import ForwardBatch
from vlserve.model.loader import LoadedModel


@dataclass
class MemoryConfig:
    max_total_tokens: int
    page_size: int = 1
    max_running_requests: int = 256
    max_context_len: int = 4096


def default_max_total_tokens(loaded: LoadedModel, fraction: float = 0.3, cap: int = 1 << 18) -> int:
    """Sizes the pool from available memory (CUDA free memory, else a share of host RAM), at most
    `cap` tokens (--max-total-tokens sets any size)."""
    t = loaded.config.text
    per_slot = KVPool.bytes_per_slot(t.num_layers, t.num_kv_heads, t.head_dim, loaded.config.dtype)
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
    else:
        import os
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(max(1024, min(cap, free * fraction // per_slot)))


class ModelRunner:
    def __init__(self, loaded: LoadedModel, memory: MemoryConfig, attention_backend: str = "torch",
                 device: str = "cpu"):
        self.loaded, self.model, self.device = loaded, loaded.model, device
        t = loaded.config.text
        self.vocab_size = t.vocab_size
        self.context_len = min(memory.max_context_len, t.max_position_embeddings)
        num_pages = max(1, memory.max_total_tokens // memory.page_size)
        self.allocator = SlotAllocator(num_pages, memory.page_size)
        self.kv = KVPool.create(t.num_layers, num_pages * memory.page_size, t.num_kv_heads, t.head_dim,
                                loaded.config.dtype, device)
        self.req_to_token = ReqToTokenPool(memory.max_running_requests, self.context_len, device)
        self.attention = AttentionBackend(attention_backend)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model(batch, self.kv, self.attention)

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.encode_images(pixel_values.to(self.device))
