"""The router's policy and approximate trees (vlserve/router/policy.py, tree.py), on real RadixCaches."""

import pytest

from vlserve.router.policy import PolicyConfig, choose, is_balanced, record
from vlserve.router.tree import ApproxTree
from vlserve.router.worker import Worker


def workers(n: int, max_tokens: int = 10_000) -> list[Worker]:
    return [Worker(f"http://w{i}", i, ApproxTree(max_tokens)) for i in range(n)]


def test_longest_match_wins_when_balanced():
    ws = workers(3)
    ws[1].tree.insert([1, 2, 3, 4, 5, 6])
    ws[2].tree.insert([1, 2, 3])
    choice = choose(ws, [1, 2, 3, 4, 5, 6, 7, 8], PolicyConfig(cache_threshold=0.5))
    assert (choice.worker.index, choice.matched, choice.cache_hit) == (1, 6, True)


def test_short_match_falls_back_to_least_loaded():
    ws = workers(2)
    ws[0].tree.insert([1, 2, 3, 4])
    ws[0].load = 1
    choice = choose(ws, [1, 9, 9, 9, 9, 9, 9, 9, 9, 9], PolicyConfig(cache_threshold=0.3))
    assert (choice.worker.index, choice.cache_hit) == (1, False)


def test_unbalanced_loads_ignore_the_cache():
    ws = workers(2)
    ws[0].tree.insert(list(range(100)))
    cfg = PolicyConfig(cache_threshold=0.1, balance_abs_threshold=4, balance_rel_threshold=1.5)
    ws[0].load, ws[1].load = 10, 5  # max - min = 5 > 4 and 10 > 7.5: unbalanced
    assert not is_balanced([10, 5], cfg)
    assert choose(ws, list(range(100)), cfg).worker.index == 1
    ws[0].load = 7  # 7 - 5 = 2: balanced again, the cache decides
    assert choose(ws, list(range(100)), cfg).worker.index == 0


def test_both_thresholds_must_be_crossed():
    cfg = PolicyConfig(balance_abs_threshold=4, balance_rel_threshold=3.0)
    assert is_balanced([100, 50], cfg)  # far apart in absolute terms, but only 2x
    assert is_balanced([3, 0], cfg)  # 3 - 0 <= 4
    assert not is_balanced([30, 5], cfg)


def test_ties_are_deterministic():
    ws = workers(3)
    assert [choose(ws, None, PolicyConfig()).worker.index for _ in range(3)] == [0, 0, 0]
    ws[0].tree.insert([7] * 50)  # equal loads: the smaller tree takes a new prefix
    assert choose(ws, [1, 2, 3], PolicyConfig()).worker.index == 1
    ws[1].tree.insert([5, 5, 5, 5])
    ws[2].tree.insert([5, 5, 5, 5])  # equal matches and loads: the lower index
    assert choose(ws, [5, 5, 5, 5, 6], PolicyConfig()).worker.index == 1


def test_groups_stick_and_spread():
    """Four prefixes, six requests each, interleaved: each prefix on one worker, both workers used."""
    ws = workers(2)
    placed: dict[int, set[int]] = {}
    for i in range(6):
        for g in range(4):
            key = [1000 + g] * 20 + [i]
            choice = choose(ws, key, PolicyConfig())
            record(choice, key)
            choice.worker.acquire()
            placed.setdefault(g, set()).add(choice.worker.index)
    assert all(len(where) == 1 for where in placed.values()), placed
    assert {w for where in placed.values() for w in where} == {0, 1}


def test_tree_keeps_its_cap_lru_first():
    tree = ApproxTree(max_tokens=10)
    tree.insert([1, 1, 1, 1])
    tree.insert([2, 2, 2, 2])
    assert tree.match_len([1, 1, 1, 1]) == 4
    tree.insert([1, 1, 1, 1])  # touched: now [2, ...] is the least recently used
    tree.insert([3, 3, 3, 3])
    assert tree.size() <= 10
    assert tree.match_len([2, 2, 2, 2]) == 0 and tree.match_len([1, 1, 1, 1]) == 4
    tree.cache.check_integrity()


def test_match_does_not_touch_recency():
    tree = ApproxTree(max_tokens=8)
    tree.insert([1, 1, 1, 1])
    tree.insert([2, 2, 2, 2])
    tree.match_len([1, 1, 1, 1])  # a peek: [1, ...] stays the oldest
    tree.insert([3, 3, 3, 3])
    assert tree.match_len([1, 1, 1, 1]) == 0 and tree.match_len([2, 2, 2, 2]) == 4


def test_failed_worker_forgets_its_cache():
    w = workers(1)[0]
    w.tree.insert([1, 2, 3])
    w.take_out()
    assert not w.healthy and w.tree.size() == 0


def test_config_is_checked():
    with pytest.raises(ValueError):
        PolicyConfig(cache_threshold=1.5)
    with pytest.raises(ValueError):
        PolicyConfig(balance_rel_threshold=0.5)
    with pytest.raises(ValueError):
        choose([], [1], PolicyConfig())
