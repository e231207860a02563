"""CacheManager's KV ownership at its edges, on a small pool with exact slot counts: the logprob cap on
a cache hit, the row a hit is written to, cached_tokens fixed at first admission, partial pages,
freeing with the cache disabled, rewind and a failed forward (survivors of the fast mutation run on
vlserve/scheduler/cache_manager.py: benchmarks/results/mutation_cache_manager_fast.md)."""

import pytest
import torch

from helpers.small_kv_pool import CAPACITY, computed, manager
from vlserve.core.config import MemoryConfig
from vlserve.core.request import Req
from vlserve.core.sampling_params import SamplingParams
from vlserve.memory.pools import KVMemory, KVShape
from vlserve.scheduler.cache_manager import CacheManager

PROMPT = list(range(1, 11))  # 10 tokens


def cached(cm: CacheManager, ids: list[int]) -> None:
    """ids computed by a request that then finished: the tree holds them, nothing locked."""
    cm.release(computed(cm, ids))


def logprob_req(start: int, return_logprob: bool = True) -> Req:
    req = Req("lp", PROMPT + [50, 51], SamplingParams())
    req.return_logprob, req.logprob_start_len = return_logprob, start
    return req


@pytest.mark.parametrize("return_logprob, start, hit", [
    (True, 5, 4),    # the logits at position 4 score token 5: positions 4.. are computed
    (True, 1, 0),
    (True, 0, 0),    # every prompt token scored: nothing may come from the cache
    (True, -1, 10),  # no input logprobs asked: the whole cached prefix
    (False, 5, 10),  # a start without return_logprob asks for nothing
])
def test_input_logprobs_cap_the_cache_hit_below_their_start(return_logprob, start, hit):
    cm = manager()
    cached(cm, PROMPT)
    req = logprob_req(start, return_logprob)
    assert cm.admit(req)
    assert req.kv_len == req.tree_len == req.cached_tokens == hit


def test_a_one_token_prompt_computes_its_token_even_when_cached():
    cm = manager()
    cached(cm, [7, 8])
    req = Req("one", [7], SamplingParams())
    assert cm.admit(req)
    assert req.kv_len == 0 and req.pending_len == 1  # its logits are needed to sample


def test_a_cache_hit_maps_the_requests_positions_to_the_trees_slots():
    cm = manager()
    first = computed(cm, PROMPT)
    slots = cm.rows.read(first.req_row, 0, 10).tolist()
    cm.release(first)
    req = Req("again", PROMPT + [11], SamplingParams())
    assert cm.admit(req) and req.kv_len == 10
    assert cm.rows.read(req.req_row, 0, 10).tolist() == slots  # position p reads the KV computed at p


def test_cached_tokens_is_fixed_at_the_first_admission():
    cm = manager()
    req = computed(cm, PROMPT)
    assert req.cached_tokens == 0
    cm.release(req)  # retracted: its KV went to the tree
    assert cm.admit(req) and req.kv_len == 9
    assert req.cached_tokens == 0  # a recompute after retraction is not a cache hit of the client's


@pytest.mark.parametrize("page_size", [2, 4])
def test_an_extension_fills_the_partly_used_last_page_first(page_size):
    cm = manager(page_size=page_size)
    req = Req("r", list(range(1, page_size + 2)), SamplingParams())  # one page and one position
    assert cm.admit(req)
    cm.advance(req, len(cm.alloc(req, page_size + 1)))
    free = cm.allocator.num_free_slots
    assert free == CAPACITY - 2 * page_size
    nxt = cm.alloc(req, page_size - 1)  # the rest of the last page: no new page
    last_page = int(cm.rows.read(req.req_row, page_size, page_size + 1)) // page_size
    assert [int(s) // page_size for s in nxt] == [last_page] * (page_size - 1)
    assert cm.allocator.num_free_slots == free


def test_a_failed_forward_frees_exactly_the_slots_it_was_given():
    cm = manager()
    req = computed(cm, PROMPT)
    free = cm.allocator.num_free_slots
    cm.alloc(req, 3)
    cm.drop_uncomputed(req, 3)
    assert cm.allocator.num_free_slots == free and req.kv_len == 10


def test_release_without_a_cache_frees_only_the_requests_own_slots():
    cm = manager(disable_radix_cache=True)
    other = computed(cm, [1, 2, 3])  # holds slots 0, 1, 2 (row 0)
    req = computed(cm, [4, 5, 6, 7])  # row 1, whose columns past 4 still read slot 0
    cm.release(req)
    assert cm.allocator.num_free_slots == CAPACITY - 3
    assert sorted(cm.allocator._free_pages) == list(range(3, CAPACITY))
    cm.release(other)
    assert cm.allocator.num_free_slots == CAPACITY and cm.cache.total_size() == 0


def test_release_frees_the_partial_last_page_the_tree_does_not_take():
    cm = manager(page_size=4)
    req = computed(cm, list(range(1, 7)))  # 6 positions: a whole page and half of one
    cm.release(req)
    assert cm.cache.total_size() == 4
    assert cm.allocator.num_free_slots == CAPACITY - 4
    cm.check_idle_accounting()


def test_a_released_request_holds_no_kv():
    cm = manager()
    req = computed(cm, PROMPT)
    cm.cache_prefix(req)
    cm.release(req)
    assert (req.req_row, req.last_node, req.kv_len, req.tree_len) == (None, None, 0, 0)
    assert req.pending_len == req.seq_len  # back to unadmitted: its next admission matches afresh


@pytest.mark.parametrize("page_size, kv_len, new_kv_len, freed", [
    (1, 10, 6, 4),
    (4, 10, 6, 4),   # positions 8, 9: their page; 4..7's page keeps 4, 5
    (4, 10, 8, 4),
    (4, 10, 9, 0),   # position 8 stays: its page stays
])
def test_rewind_frees_the_pages_past_the_new_end(page_size, kv_len, new_kv_len, freed):
    cm = manager(page_size=page_size)
    req = computed(cm, list(range(1, kv_len + 1)))
    kept = cm.rows.read(req.req_row, 0, new_kv_len).tolist()
    free = cm.allocator.num_free_slots
    cm.rewind(req, new_kv_len)
    assert req.kv_len == new_kv_len
    assert cm.allocator.num_free_slots == free + freed
    taken = set(range(CAPACITY)) - {s for page in cm.allocator._free_pages
                                     for s in range(page * page_size, (page + 1) * page_size)}
    assert set(kept) <= taken  # what stays is still the request's


# ---- CacheManager's accounting at its edges, directly on a small pool (survivors of the mutation run
# on vlserve/scheduler/cache_manager.py: benchmarks/results/mutation_admission.md) ---------------------


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


def test_the_radix_cache_is_on_unless_disabled():
    memory = KVMemory.create(KVShape(1, 1, 4, torch.float32), MemoryConfig(
        max_total_tokens=CAPACITY, page_size=1, max_running_requests=1, context_length=CAPACITY))
    assert not CacheManager(memory).cache.disabled
