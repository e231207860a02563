import pytest
import torch

from vlserve.cache.radix_cache import RadixCache


class FreeList:
    """A plain slot free list; remembers what it got back, in order."""

    def __init__(self, capacity: int = 1024):
        self.free_slots = list(range(capacity - 1, -1, -1))
        self.freed: list[int] = []

    def alloc(self, n: int) -> torch.Tensor:
        assert n <= len(self.free_slots), "test pool exhausted"
        return torch.tensor([self.free_slots.pop() for _ in range(n)], dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> None:
        self.freed.extend(indices.tolist())
        self.free_slots.extend(indices.tolist())


def serve(cache: RadixCache, pool: FreeList, key: list[int]) -> None:
    """What the scheduler does for one request: match, lock, allocate the rest, insert, unlock."""
    match = cache.match_prefix(key)
    cache.lock(match.node)
    fresh = pool.alloc(len(key) - match.prefix_len)
    assert cache.insert(key, torch.cat([match.indices, fresh])) == match.prefix_len
    cache.unlock(match.node)


def evict_edges(cache: RadixCache, pool: FreeList, num_tokens: int) -> list[tuple[int, ...]]:
    """Evicts and returns the edges that went, in eviction order."""
    edge_of_slot = {s: tuple(n.key) for n in cache.iter_nodes() for s in n.value.tolist()}
    start = len(pool.freed)
    cache.evict(num_tokens)
    edges: list[tuple[int, ...]] = []
    for slot in pool.freed[start:]:
        if not edges or edges[-1] != edge_of_slot[slot]:
            edges.append(edge_of_slot[slot])
    return edges


# Figure 3 of the SGLang paper, with short integer runs standing for the strings.
SYS = [1, 2, 3]  # "You are a helpful assistant."
HELLO = [10, 11, 12]  # "User: Hello! Assistant: Hi!"
SOLVE = [13, 14, 15]  # "User: Solve this problem. Assistant: Sure! ..."
NEXT = [16, 17]  # the first session's next message
WHAT = [20, 21, 22]  # "User: What can you do? Assistant: I can ..."
STORY = [23, 24, 25]  # "User: Write a story. Assistant: Sure! ..."
SHOTS = [30, 31, 32, 33]  # "Question 1: ... Answer 1: ... Question 2: ... Answer 2: ..."
Q_I, Q_J, Q_K, Q_L = [40, 41], [42, 43], [44, 45], [46, 47]  # the few-shot queries' questions


def t(*runs: list[int]) -> tuple[int, ...]:
    return tuple(tok for run in runs for tok in run)


def test_paper_figure_3_trace():
    pool = FreeList()
    cache = RadixCache(pool)
    # (1) empty
    assert cache.shape() == {} and cache.total_size() == 0
    # (2) one chat turn, one edge
    serve(cache, pool, SYS + HELLO)
    assert cache.shape() == {t(SYS, HELLO): {}}
    # (3) the session continues: the new turn becomes a child
    serve(cache, pool, SYS + HELLO + SOLVE)
    assert cache.shape() == {t(SYS, HELLO): {t(SOLVE): {}}}
    # (4) a second session shares the system prompt: the first edge splits
    serve(cache, pool, SYS + WHAT)
    assert cache.shape() == {t(SYS): {t(HELLO): {t(SOLVE): {}}, t(WHAT): {}}}
    # (5) the second session continues under memory pressure: the LRU leaf (SOLVE) goes
    match = cache.match_prefix(SYS + WHAT + STORY)
    cache.lock(match.node)
    assert evict_edges(cache, pool, 3) == [t(SOLVE)]
    cache.insert(SYS + WHAT + STORY, torch.cat([match.indices, pool.alloc(3)]))
    cache.unlock(match.node)
    assert cache.shape() == {t(SYS): {t(HELLO): {}, t(WHAT): {t(STORY): {}}}}
    # (6) a few-shot query shares nothing: a new child of the root
    serve(cache, pool, SHOTS + Q_I)
    assert cache.shape()[t(SHOTS, Q_I)] == {}
    # (7) more few-shot queries share the examples: that edge splits, one leaf per question
    for question in (Q_J, Q_K, Q_L):
        serve(cache, pool, SHOTS + question)
    assert cache.shape() == {
        t(SYS): {t(HELLO): {}, t(WHAT): {t(STORY): {}}},
        t(SHOTS): {t(Q_I): {}, t(Q_J): {}, t(Q_K): {}, t(Q_L): {}},
    }
    assert cache.total_size() == 3 + 3 + 3 + 3 + 4 + 4 * 2
    # (8) the first session comes back; the second session's nodes are the least recently used
    # (leaf first, then its parent once it has become a leaf)
    key = SYS + HELLO + SOLVE + NEXT  # its history: the evicted turn is computed again
    match = cache.match_prefix(key)
    assert match.prefix_len == 6
    cache.lock(match.node)
    assert evict_edges(cache, pool, 6) == [t(STORY), t(WHAT)]
    cache.insert(key, torch.cat([match.indices, pool.alloc(5)]))
    cache.unlock(match.node)
    assert cache.shape() == {
        t(SYS): {t(HELLO): {t(SOLVE, NEXT): {}}},
        t(SHOTS): {t(Q_I): {}, t(Q_J): {}, t(Q_K): {}, t(Q_L): {}},
    }
    # (9) more samples for question j: its path is locked while they run; i, k, l go in LRU order
    running = cache.match_prefix(SHOTS + Q_J)
    cache.lock(running.node)
    assert evict_edges(cache, pool, 6) == [t(Q_I), t(Q_K), t(Q_L)]
    samples = []
    for answer in ([50], [51]):
        key = SHOTS + Q_J + answer
        cache.insert(key, torch.cat([running.indices, pool.alloc(1)]))
        samples.append(cache.match_prefix(key))
        cache.lock(samples[-1].node)
    assert cache.shape() == {
        t(SYS): {t(HELLO): {t(SOLVE, NEXT): {}}},
        t(SHOTS): {t(Q_J): {(50,): {}, (51,): {}}},
    }
    # everything unlocked can go; the locked few-shot branch stays
    assert evict_edges(cache, pool, 10**6) == [t(SOLVE, NEXT), t(HELLO), t(SYS)]
    assert cache.shape() == {t(SHOTS): {t(Q_J): {(50,): {}, (51,): {}}}}
    assert (cache.protected_size(), cache.evictable_size()) == (8, 0)
    cache.unlock(running.node)
    for sample in samples:
        cache.unlock(sample.node)
    assert (cache.protected_size(), cache.evictable_size()) == (0, 8)
    cache.check_integrity()


def test_split_keeps_lock_on_new_parent():
    pool = FreeList()
    cache = RadixCache(pool)
    cache.insert([1, 2, 3, 4], pool.alloc(4))
    held = cache.match_prefix([1, 2, 3, 4])
    cache.lock(held.node)
    other = cache.match_prefix([1, 2, 9])  # splits [1 2 3 4] into [1 2] + [3 4]
    assert other.prefix_len == 2
    assert cache.shape() == {(1, 2): {(3, 4): {}}}
    assert other.node.lock_ref == 1 and held.node.lock_ref == 1
    assert other.node is held.node.parent
    assert cache.evict(100) == 0 and pool.freed == []
    cache.unlock(held.node)
    assert other.node.lock_ref == 0
    assert (cache.evictable_size(), cache.protected_size()) == (4, 0)
    cache.check_integrity()


def test_lock_unlock_sizes():
    pool = FreeList()
    cache = RadixCache(pool)
    cache.insert([1, 2, 3], pool.alloc(3))
    cache.insert([1, 2, 3, 4, 5], torch.cat([cache.match_prefix([1, 2, 3]).indices, pool.alloc(2)]))
    cache.insert([7, 8], pool.alloc(2))
    assert (cache.total_size(), cache.evictable_size(), cache.protected_size()) == (7, 7, 0)
    deep = cache.match_prefix([1, 2, 3, 4, 5]).node
    shallow = cache.match_prefix([1, 2, 3]).node
    cache.lock(deep)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    cache.lock(shallow)  # a second holder of [1 2 3] protects nothing new
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    cache.unlock(deep)
    assert (cache.evictable_size(), cache.protected_size()) == (4, 3)
    cache.unlock(shallow)
    assert (cache.evictable_size(), cache.protected_size()) == (7, 0)
    with pytest.raises(AssertionError):
        cache.unlock(shallow)
    cache.lock(cache.root)  # the root is always protected: a no-op
    cache.unlock(cache.root)
    cache.check_integrity()


def test_page_size_4_matches_whole_pages_only():
    pool = FreeList()
    cache = RadixCache(pool, page_size=4)
    key = list(range(10))
    slots = pool.alloc(10)
    assert cache.insert(key, slots) == 0
    assert cache.shape() == {tuple(range(8)): {}}  # the partial last page is not cached
    assert cache.total_size() == 8
    assert cache.match_prefix(key).indices.tolist() == slots[:8].tolist()
    assert cache.match_prefix(list(range(7))).prefix_len == 4  # 7 tokens: one whole page
    assert cache.shape() == {(0, 1, 2, 3): {(4, 5, 6, 7): {}}}  # split on the page boundary
    assert cache.match_prefix([0, 1, 2, 9, 4, 5, 6, 7]).prefix_len == 0  # first page differs
    diverge = [0, 1, 2, 3, 4, 5, 99, 7]  # differs inside the second page
    assert cache.peek_prefix_len(diverge) == 4
    assert cache.insert(diverge, pool.alloc(8)) == 4
    assert cache.shape() == {(0, 1, 2, 3): {(4, 5, 6, 7): {}, (4, 5, 99, 7): {}}}
    assert cache.insert([0, 1, 2], pool.alloc(3)) == 0 and cache.total_size() == 12
    cache.check_integrity()


def test_insert_returns_prefix_already_cached_and_never_frees():
    pool = FreeList()
    cache = RadixCache(pool)
    a = pool.alloc(3)
    assert cache.insert([1, 2, 3], a) == 0
    b = pool.alloc(5)  # a caller that did not match first: its first 3 slots are duplicates
    assert cache.insert([1, 2, 3, 4, 5], b) == 3
    # the tree keeps the older slots for the shared prefix and takes the caller's for the rest
    assert cache.match_prefix([1, 2, 3, 4, 5]).indices.tolist() == a.tolist() + b[3:].tolist()
    assert cache.insert([1, 2], pool.alloc(2)) == 2  # fully cached: stores nothing, splits
    assert cache.shape() == {(1, 2): {(3,): {(4, 5): {}}}}
    assert cache.insert([1, 2, 7], pool.alloc(3)) == 2
    assert cache.total_size() == 6 and pool.freed == []
    with pytest.raises(ValueError, match="indices"):
        cache.insert([1, 2, 3], pool.alloc(2))
    cache.check_integrity()


def test_evict_never_touches_a_locked_node():
    pool = FreeList()
    cache = RadixCache(pool)
    old = pool.alloc(2)
    cache.insert([1, 2], old)  # least recently used, but locked
    cache.lock(cache.match_prefix([1, 2]).node)
    cache.insert([3, 4], pool.alloc(2))
    cache.insert([5, 6], pool.alloc(2))
    cache.match_prefix([3, 4])  # [5 6] is now the least recently used unlocked leaf
    assert evict_edges(cache, pool, 1) == [(5, 6)]
    assert evict_edges(cache, pool, 100) == [(3, 4)]
    assert cache.shape() == {(1, 2): {}}
    assert not set(old.tolist()) & set(pool.freed)
    cache.check_integrity()


def test_parent_is_evicted_after_its_last_child():
    pool = FreeList()
    cache = RadixCache(pool)
    for key in ([1, 2, 3], [1, 2, 4], [9, 9]):
        serve(cache, pool, key)
    cache.match_prefix([9, 9])  # newest
    assert cache.shape() == {(1, 2): {(3,): {}, (4,): {}}, (9, 9): {}}
    # [1 2] is not a leaf while a child remains; it becomes one, older than [9 9]
    assert evict_edges(cache, pool, 3) == [(3,), (4,), (1, 2)]
    assert cache.shape() == {(9, 9): {}}
    assert cache.evictable_size() == 2
    cache.check_integrity()


def test_peek_neither_splits_nor_refreshes():
    pool = FreeList()
    cache = RadixCache(pool)
    serve(cache, pool, [1, 2, 3])
    serve(cache, pool, [5, 6])
    assert cache.peek_prefix_len([1, 2, 8]) == 2
    assert cache.peek_prefix_len([1, 2, 3, 4]) == 3
    assert cache.shape() == {(1, 2, 3): {}, (5, 6): {}}
    assert evict_edges(cache, pool, 1) == [(1, 2, 3)]  # still the least recently used


def test_evicted_handle_cannot_be_locked():
    pool = FreeList()
    cache = RadixCache(pool)
    serve(cache, pool, [1, 2])
    node = cache.match_prefix([1, 2]).node
    cache.evict(2)
    with pytest.raises(ValueError, match="no longer in the tree"):
        cache.lock(node)


def test_handles_from_before_a_reset_cannot_be_locked_or_unlocked():
    """reset() invalidates every old handle, locked or not (a handle left alive would let a request
    lock slots that reset() already freed)."""
    pool = FreeList()
    cache = RadixCache(pool)
    serve(cache, pool, [1, 2, 3])
    held, idle = cache.match_prefix([1, 2, 3]).node, cache.match_prefix([1]).node
    cache.lock(held)
    cache.reset()
    for node in (held, idle):
        with pytest.raises(ValueError, match="no longer in the tree"):
            cache.lock(node)
    with pytest.raises(ValueError, match="no longer in the tree"):
        cache.unlock(held)


def test_reset_frees_everything():
    pool = FreeList()
    cache = RadixCache(pool)
    serve(cache, pool, [1, 2, 3])
    serve(cache, pool, [1, 5])
    cache.lock(cache.match_prefix([1, 5]).node)
    cache.reset()
    assert sorted(pool.freed) == [0, 1, 2, 3]
    assert cache.shape() == {} and cache.total_size() == 0
    assert cache.match_prefix([1, 2, 3]).prefix_len == 0
    cache.check_integrity()


def test_disabled_cache_never_matches_or_stores():
    pool = FreeList()
    cache = RadixCache(pool, disabled=True)
    assert cache.insert([1, 2, 3], pool.alloc(3)) == 0
    match = cache.match_prefix([1, 2, 3])
    assert match.prefix_len == 0 and match.node is cache.root
    assert cache.peek_prefix_len([1, 2, 3]) == 0  # the scheduler's ordering sees no hit either
    cache.lock(match.node)
    cache.unlock(match.node)
    assert cache.total_size() == 0 and cache.evict(10) == 0 and pool.freed == []


def test_pretty_lists_every_edge():
    pool = FreeList()
    cache = RadixCache(pool)
    serve(cache, pool, [1, 2, 3])
    serve(cache, pool, [1, 2, 4])
    lines = cache.pretty().splitlines()
    assert [line.split(" lock")[0] for line in lines] == ["[1, 2]", "  [3]", "  [4]"]


def test_bad_page_size():
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(FreeList(), page_size=0)


# ---- The radix cache at the edges the first radix tests left open: sizes with locked and unlocked nodes
# together, keys that end inside a deeper edge or part way into a page, LRU ties in the heap, the
# integrity check's lock and size invariants, and the errors' messages (survivors of the mutation run on
# vlserve/cache/radix_cache.py: benchmarks/results/mutation_radix_cache_fast.md). ----


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
