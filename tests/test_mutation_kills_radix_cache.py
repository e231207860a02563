"""The radix cache at the edges the first radix tests left open: sizes with locked and unlocked
nodes together, keys that end inside a deeper edge or part way into a page, LRU ties in the heap,
the integrity check's lock and size invariants, and the errors' messages (survivors of the mutation
run on vlserve/cache/radix_cache.py: benchmarks/results/mutation_radix_cache_fast.md)."""

import pytest
import torch

from test_radix_cache import FreeList, evict_edges, serve
from vlserve.cache.radix_cache import RadixCache


def tree(*keys: list[int], page_size: int = 1) -> tuple[RadixCache, FreeList]:
    """A cache that served these keys, one request each (all unlocked again)."""
    pool = FreeList()
    cache = RadixCache(pool, page_size=page_size)
    for key in keys:
        serve(cache, pool, key)
    return cache, pool


def test_total_size_counts_locked_and_unlocked_tokens():
    cache, _ = tree([1, 2, 3], [7, 8])
    cache.lock(cache.match_prefix([1, 2, 3]).node)
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (2, 3, 5)
    cache.check_integrity()


def test_a_key_that_ends_inside_a_deeper_edge_matches_up_to_its_end():
    cache, _ = tree([1, 2, 3, 4, 5, 6], [1, 2, 9])  # splits: [1 2] -> [3 4 5 6] and [9]
    slots = cache.match_prefix([1, 2, 3, 4, 5, 6]).indices.tolist()
    assert cache.peek_prefix_len([1, 2, 3, 4]) == 4
    match = cache.match_prefix([1, 2, 3, 4])
    assert match.indices.tolist() == slots[:4] and list(match.node.key) == [3, 4]
    cache.check_integrity()


@pytest.mark.parametrize("shared", [5, 6, 7])
def test_a_mismatch_inside_a_page_matches_only_the_whole_pages_before_it(shared):
    key = list(range(1, 9))
    cache, _ = tree(key, page_size=4)
    other = key[:shared] + [99] * (8 - shared)
    assert cache.peek_prefix_len(other) == 4
    assert cache.match_prefix(other).prefix_len == 4
    cache.check_integrity()


def test_lru_ties_in_the_heap_go_to_the_older_node():
    # [1 2] and its child [3 4] get the same stamp (one insert); a lock and unlock of [3 4] leaves a
    # second heap entry for it, still there once [3 4] is evicted and [1 2], a leaf now, is pushed
    # with that stamp: the heap orders the two by uid, never by comparing nodes
    cache, pool = tree([1, 2], [1, 2, 3, 4], [5, 6])
    leaf = next(n for n in cache.iter_nodes() if n.key == [3, 4])
    cache.lock(leaf)  # a request holding [1 2 3 4] lets go: no recency change
    cache.unlock(leaf)
    assert evict_edges(cache, pool, 2) == [(3, 4)]
    assert evict_edges(cache, pool, 2) == [(1, 2)]
    assert evict_edges(cache, pool, 2) == [(5, 6)]
    assert cache.total_size() == 0
    cache.check_integrity()


def test_integrity_allows_a_node_locked_twice():
    cache, pool = tree([1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).node
    cache.lock(node)
    cache.lock(node)  # two requests share this prefix
    cache.check_integrity()


def test_integrity_counts_every_protected_node():
    cache, pool = tree()
    for key in ([1, 2, 3], [7, 8]):
        serve(cache, pool, key)
        cache.lock(cache.match_prefix(key).node)
    cache.check_integrity()
    assert cache.protected_size() == 5


def test_integrity_catches_a_child_with_more_locks_than_its_parent():
    cache, pool = tree([1, 2, 3], [1, 2, 4])
    leaf = cache.match_prefix([1, 2, 3]).node
    cache.lock(leaf)
    leaf.lock_ref += 1  # a lock that did not go up the path
    with pytest.raises(AssertionError):
        cache.check_integrity()


def test_the_errors_say_what_went_wrong():
    cache, pool = tree([1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).node
    with pytest.raises(AssertionError, match="^unlock of a radix node that is not locked$"):
        cache.unlock(node)
    cache.evict(3)
    with pytest.raises(ValueError, match=r"^radix node is no longer in the tree \(evicted or reset\)$"):
        cache.lock(node)
    assert torch.equal(torch.tensor(sorted(pool.freed)), torch.tensor(sorted(node.value.tolist())))


def test_insert_refuses_indices_that_are_not_one_slot_per_token():
    cache = RadixCache(FreeList())
    with pytest.raises(ValueError, match="^indices must be a 1-D tensor of KV slot indices$"):
        cache.insert([1, 2, 3], torch.arange(3).reshape(3, 1))
    with pytest.raises(ValueError, match="^indices must be a 1-D tensor of KV slot indices$"):
        cache.insert([1, 2, 3], [0, 1, 2])
    with pytest.raises(ValueError, match="^key has 3 tokens but indices has 2 slots$"):
        cache.insert([1, 2, 3], torch.arange(2))
    assert cache.total_size() == 0


def test_the_tree_keeps_its_own_int64_copy_of_the_slots():
    cache = RadixCache(FreeList())
    slots = torch.tensor([5, 6, 7], dtype=torch.int32)
    cache.insert([1, 2, 3], slots)
    slots[0] = 99  # the caller's tensor is the caller's
    match = cache.match_prefix([1, 2, 3])
    assert match.indices.dtype == torch.int64 and match.indices.tolist() == [5, 6, 7]


def test_repeated_hits_keep_the_lru_heap_bounded_and_in_order():
    # every hit pushes a fresh heap entry for the leaf it touches; stale ones are dropped once the
    # heap holds more than 2 entries per node + 64, so a long-lived hot prefix costs bounded memory
    cache, pool = tree()
    for key in ([1, 2], [3, 4], [5, 6]):
        serve(cache, pool, key)
    for i in range(300):
        cache.match_prefix([1, 2] if i % 2 else [3, 4])
        assert len(cache._lru_heap) <= 2 * 3 + 64
    assert evict_edges(cache, pool, 6) == [(5, 6), (3, 4), (1, 2)]  # least recently used first
    cache.check_integrity()


def test_keys_may_be_any_sequence_of_ids():
    cache, pool = tree([1, 2, 3])
    slots = cache.match_prefix([1, 2, 3]).indices.tolist()
    assert cache.match_prefix((1, 2, 3)).indices.tolist() == slots
    assert cache.peek_prefix_len(range(1, 4)) == 3
    assert cache.match_prefix(torch.tensor([1, 2, 9])).prefix_len == 2


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_miss_is_an_empty_int64_tensor_on_the_caches_device(device):
    cache = RadixCache(FreeList(), device=device)
    assert cache.device == torch.device(device)
    for c in (cache, RadixCache(FreeList(), device=device, disabled=True)):
        miss = c.match_prefix([1, 2, 3]).indices
        assert miss.shape == (0,) and miss.dtype == torch.int64 and miss.device.type == device


def test_pages_with_the_same_first_token_are_different_children():
    # same first token, another first page: a sibling, no split
    cache, pool = tree([1, 2, 3, 4], [1, 3, 5, 6], page_size=2)
    assert sorted(cache.shape()) == [(1, 2, 3, 4), (1, 3, 5, 6)]
    assert cache.match_prefix([1, 3, 5, 6]).prefix_len == 4 and cache.match_prefix([1, 2, 3, 4]).prefix_len == 4
    cache.check_integrity()
