"""A CacheManager (and a PrefillAdmission over it) on a 32-slot KV pool with exact slot counts, for
tests that set each edge of KV ownership and admission by hand."""

import torch

from vlserve.core.config import MemoryConfig
from vlserve.core.request import Req
from vlserve.core.sampling_params import SamplingParams
from vlserve.memory.pools import KVMemory, KVShape
from vlserve.scheduler.cache_manager import CacheManager
from vlserve.scheduler.policy import SchedulePolicy
from vlserve.scheduler.prefill import PrefillAdmission

CAPACITY = 32


def manager(rows: int = 2, page_size: int = 1, disable_radix_cache: bool = False) -> CacheManager:
    cfg = MemoryConfig(max_total_tokens=CAPACITY, page_size=page_size, max_running_requests=rows,
                       context_length=CAPACITY)
    return CacheManager(KVMemory.create(KVShape(1, 1, 4, torch.float32), cfg), disable_radix_cache)


def admission(cm: CacheManager, new_token_ratio: float = 0.5, prefix_share_threshold: int = 0) -> PrefillAdmission:
    return PrefillAdmission(cm, SchedulePolicy("fcfs", cm.cache), new_token_ratio, max_running_requests=4,
                            prefix_share_threshold=prefix_share_threshold)


def computed(cm: CacheManager, ids: list[int]) -> Req:
    """A request admitted with its whole prompt computed (as after its prefill)."""
    req = Req("r", list(ids), SamplingParams())
    assert cm.admit(req)
    n = req.pending_len
    cm.alloc(req, n)
    cm.advance(req, n)
    return req
