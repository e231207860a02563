"""Admission and KV ownership at their edges, directly on a small pool: CacheManager's accounting and
PrefillAdmission's decode reserve and in-batch prefix sharing (survivors of the mutation runs on
vlserve/scheduler/cache_manager.py and prefill.py: benchmarks/results/mutation_admission.md)."""

import pytest
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


def test_available_slots_count_what_eviction_can_free():
    cm = manager()
    cm.release(computed(cm, list(range(1, 11))))  # 10 tokens now cached in the tree, unlocked
    assert cm.allocator.num_free_slots == CAPACITY - 10 and cm.cache.evictable_size() == 10
    assert cm.available_slots() == CAPACITY
    assert cm.pool_state() == {"free": CAPACITY - 10, "cached": 10, "in_use": 0}  # the gauges' state labels
    other = Req("o", [99], SamplingParams())
    assert cm.admit(other)
    cm.alloc(other, cm.available_slots())  # the whole pool: only possible by evicting the tree
    assert cm.allocator.num_free_slots == 0 and cm.cache.total_size() == 0


def test_admit_refuses_when_every_row_is_taken():
    cm = manager(rows=1)
    first = computed(cm, [1, 2, 3])
    late = Req("late", [1, 2, 3, 4], SamplingParams())
    assert cm.admit(late) is False
    assert late.req_row is None and late.last_node is None and late.kv_len == 0
    assert cm.rows.num_free == 0
    cm.release(first)
    assert cm.admit(late) and late.req_row is not None


def test_rewind_into_tree_owned_kv_is_refused():
    cm = manager()
    req = computed(cm, list(range(1, 9)))
    cm.cache_prefix(req)  # the tree now owns positions 0..7
    assert req.tree_len == 8
    with pytest.raises(AssertionError, match="^cannot rewind into tree-owned KV$"):
        cm.rewind(req, 4)


@pytest.mark.parametrize("ratio, max_new_tokens, outputs, reserve", [
    (0.5, 10, 0, 5), (0.55, 10, 0, 6), (0.5, 10, 4, 3), (0.5, 10, 10, 0), (1.0, 7, 0, 7)])
def test_the_decode_reserve_is_the_remaining_tokens_times_the_ratio_rounded_up(ratio, max_new_tokens, outputs,
                                                                                reserve):
    req = Req("r", [1, 2], SamplingParams(max_new_tokens=max_new_tokens))
    req.output_ids = [3] * outputs
    assert admission(manager(), ratio).reserve(req) == reserve


def test_a_prompt_and_its_reserve_must_fit_the_pool():
    cm = manager()
    fits = Req("fits", list(range(1, 17)), SamplingParams(max_new_tokens=32))  # 16 + 32 * 0.5 = 32
    too_big = Req("big", list(range(1, 18)), SamplingParams(max_new_tokens=32))  # 17 + 16 = 33
    assert [p.req for p in admission(cm).admit([too_big], [], token_budget=64)] == []
    assert too_big.req_row is None and cm.rows.num_free == 2 and cm.available_slots() == CAPACITY
    assert [p.req for p in admission(cm).admit([fits], [], token_budget=64)] == [fits]


def test_no_in_batch_sharing_without_a_cache_or_without_a_threshold():
    # the second request shares all but its last token with the first: with a cache and a threshold
    # it borrows the first one's slots for them; without a cache there is nothing to share
    def two() -> list[Req]:
        prompt = list(range(1, 9))
        return [Req("a", prompt + [20], SamplingParams(max_new_tokens=2)),
                Req("b", prompt + [21], SamplingParams(max_new_tokens=2))]
    for cm, threshold in ((manager(disable_radix_cache=True), 4), (manager(), 0)):
        planned = admission(cm, prefix_share_threshold=threshold).admit(two(), [], token_budget=64)
        assert [(p.req.rid, p.num_tokens) for p in planned] == [("a", 9), ("b", 9)]
        assert planned[1].req.borrowed is None
    sharing = admission(manager(), prefix_share_threshold=4).admit(two(), [], token_budget=64)
    assert [(p.req.rid, p.num_tokens) for p in sharing] == [("a", 9), ("b", 1)]


def test_the_radix_cache_is_on_unless_disabled():
    memory = KVMemory.create(KVShape(1, 1, 4, torch.float32), MemoryConfig(
        max_total_tokens=CAPACITY, page_size=1, max_running_requests=1, context_length=CAPACITY))
    assert not CacheManager(memory).cache.disabled
