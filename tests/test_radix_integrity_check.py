"""RadixCache.check_integrity, the oracle of the radix tests, rejects each kind of corrupt tree.

Bug caught: a weakened invariant (an `and` turned `or`) makes every test that
relies on check_integrity blind to the corruption it was meant to find (mutation survivors at
radix_cache.py check_integrity).
"""

import pytest
import torch

from test_radix_cache import FreeList, serve
from vlserve.cache.radix_cache import RadixCache


def _tree(page_size: int = 1) -> tuple[RadixCache, object]:
    pool = FreeList()
    cache = RadixCache(pool, page_size=page_size)
    serve(cache, pool, [1, 2, 3, 4])
    serve(cache, pool, [1, 2, 5, 6])
    cache.check_integrity()  # sound before each corruption below
    return cache, cache.match_prefix([1, 2, 5, 6]).node


def test_a_dead_node_still_in_the_tree_is_caught():
    cache, leaf = _tree()
    leaf.alive = False
    with pytest.raises(AssertionError):
        cache.check_integrity()


def test_a_node_with_a_partial_page_is_caught():
    cache, leaf = _tree(page_size=2)
    # [5, 6] -> [5, 6, 7]: the first page (the child key) still matches, the last page is partial
    leaf.key, leaf.value = leaf.key + [7], torch.cat([leaf.value, leaf.value[:1]])
    cache._evictable += 1  # the totals agree: only the partial page is wrong
    with pytest.raises(AssertionError):
        cache.check_integrity()
