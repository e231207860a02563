"""CacheManager's KV ownership at its edges, on a small pool with exact slot counts: the logprob cap on
a cache hit, the row a hit is written to, cached_tokens fixed at first admission, partial pages,
freeing with the cache disabled, rewind and a failed forward (survivors of the fast mutation run on
vlserve/scheduler/cache_manager.py: benchmarks/results/mutation_cache_manager_fast.md)."""

import pytest

from test_mutation_kills_admission import CAPACITY, computed, manager
from vlserve.core.request import Req
from vlserve.core.sampling_params import SamplingParams
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
