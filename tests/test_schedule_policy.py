from dataclasses import dataclass

import pytest
import torch

from vlserve.cache.radix_cache import RadixCache
from vlserve.scheduler.policy import SchedulePolicy


@dataclass(eq=False)
class Req:
    name: str
    seq: list[int]
    arrival_step: int = 0
    matched_len: int = -1


class Pool:
    def __init__(self, capacity: int = 1024):
        self.free_slots = list(range(capacity))

    def alloc(self, n: int) -> torch.Tensor:
        assert n <= len(self.free_slots), "pool exhausted"
        return torch.tensor([self.free_slots.pop() for _ in range(n)], dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> None:
        self.free_slots.extend(indices.tolist())


def cache_with(*keys: list[int]) -> RadixCache:
    pool = Pool()
    cache = RadixCache(pool)
    for key in keys:
        cache.insert(key, pool.alloc(len(key)))
    return cache


def names(reqs) -> list[str]:
    return [r.name for r in reqs]


def run_one_at_a_time(policy_name: str, reqs: list[Req], capacity: int) -> tuple[list[str], int]:
    """Serves requests one by one in the policy's order through a cache of `capacity` slots;
    returns the order and the number of prompt tokens computed (not hit in the cache)."""
    pool = Pool(capacity)
    cache = RadixCache(pool)
    policy = SchedulePolicy(policy_name, cache, max_wait_steps=10**9)
    waiting, served, computed = list(reqs), [], 0
    while waiting:
        req = policy.order(waiting)[0]
        waiting.remove(req)
        match = cache.match_prefix(req.seq)
        cache.lock(match.node)
        need = len(req.seq) - match.prefix_len
        if need > len(pool.free_slots):
            cache.evict(need - len(pool.free_slots))
        cache.insert(req.seq, torch.cat([match.indices, pool.alloc(need)]))
        cache.unlock(match.node)
        served.append(req.name)
        computed += need
    return served, computed


def test_unknown_policy_names_the_allowed_ones():
    with pytest.raises(ValueError, match="lpm, dfs-weight, fcfs, random"):
        SchedulePolicy("sjf", cache_with())


def test_fcfs_is_arrival_order():
    policy = SchedulePolicy("fcfs", cache_with([1, 2, 3]))
    reqs = [Req("c", [1, 2, 3], 5), Req("a", [9], 1), Req("b", [1, 2], 3)]
    assert names(policy.order(reqs)) == ["a", "b", "c"]


def test_random_is_a_seeded_permutation():
    reqs = [Req(str(i), [i], i) for i in range(8)]
    first = names(SchedulePolicy("random", cache_with(), seed=3).order(reqs))
    again = names(SchedulePolicy("random", cache_with(), seed=3).order(reqs))
    assert first == again and sorted(first) == sorted(names(reqs))
    assert first != names(reqs)


def test_lpm_orders_by_cached_prefix_without_touching_the_cache():
    cache = cache_with([1, 2, 3, 4], [7, 8])
    before = cache.pretty()
    policy = SchedulePolicy("lpm", cache)
    reqs = [Req("a", [9, 9], 0), Req("b", [1, 2, 5], 1), Req("c", [1, 2, 3, 4, 6], 2), Req("d", [7, 8, 1], 3)]
    ordered = policy.order(reqs)
    assert names(ordered) == ["c", "b", "d", "a"]  # b and d tie at 2: arrival order
    assert [r.matched_len for r in reqs] == [0, 2, 4, 2]
    assert cache.pretty() == before  # no split, no recency change


# Requests of the paper's Figure 3: two chat sessions and four few-shot queries, interleaved.
SYS, HELLO, SOLVE, WHAT, STORY = [1, 2, 3], [10, 11, 12], [13, 14, 15], [20, 21, 22], [23, 24, 25]
SHOTS = [30, 31, 32, 33]
FIGURE_3_REQUESTS = [
    Req("chat1", SYS + HELLO, 0),
    Req("shot_i", SHOTS + [40, 41], 1),
    Req("chat2", SYS + WHAT, 2),
    Req("shot_j", SHOTS + [42, 43], 3),
    Req("chat1+", SYS + HELLO + SOLVE, 4),
    Req("shot_k", SHOTS + [44, 45], 5),
    Req("chat2+", SYS + WHAT + STORY, 6),
    Req("shot_l", SHOTS + [46, 47], 7),
]


def is_dfs_order(keys: list[list[int]]) -> bool:
    """True when, for every prefix, the keys that start with it are contiguous."""
    prefixes = {tuple(k[:n]) for k in keys for n in range(1, len(k) + 1)}
    for prefix in prefixes:
        under = [i for i, k in enumerate(keys) if tuple(k[: len(prefix)]) == prefix]
        if under != list(range(under[0], under[-1] + 1)):
            return False
    return True


def test_lpm_serves_in_dfs_order_and_computes_each_token_once():
    by_name = {r.name: r.seq for r in FIGURE_3_REQUESTS}
    distinct_tokens = len({tuple(k[:n]) for k in by_name.values() for n in range(1, len(k) + 1)})
    capacity = max(len(k) for k in by_name.values())  # Theorem 3.1: cache >= longest request
    served, computed = run_one_at_a_time("lpm", FIGURE_3_REQUESTS, capacity)
    assert is_dfs_order([by_name[n] for n in served])
    assert served == ["chat1", "chat1+", "chat2", "chat2+", "shot_i", "shot_j", "shot_k", "shot_l"]
    assert computed == distinct_tokens == 27
    fcfs_served, fcfs_computed = run_one_at_a_time("fcfs", FIGURE_3_REQUESTS, capacity)
    assert not is_dfs_order([by_name[n] for n in fcfs_served])
    assert fcfs_computed > distinct_tokens


def test_dfs_weight_visits_heavier_subtrees_first():
    cache = cache_with([5, 5, 5, 5, 5, 5], [1, 2])
    reqs = [Req("deep", [5, 5, 5, 5, 5, 5, 0], 0)] + [Req(f"y{i}", [1, 2, 10 + i], 1 + i) for i in range(3)]
    assert names(SchedulePolicy("lpm", cache).order(reqs)) == ["deep", "y0", "y1", "y2"]
    assert names(SchedulePolicy("dfs-weight", cache).order(reqs)) == ["y0", "y1", "y2", "deep"]


def test_dfs_weight_children_before_a_nodes_own_requests():
    cache = cache_with([1, 2, 3], [1, 2, 4, 5], [7, 8])
    before = cache.pretty()
    reqs = [
        Req("a", [7, 8, 9], 0),  # [7 8]
        Req("b", [1, 2, 3, 9], 1),  # [1 2] -> [3]
        Req("c", [1, 2, 4, 5, 9], 2),  # [1 2] -> [4 5]
        Req("d", [1, 2, 4, 5, 8], 3),  # [1 2] -> [4 5]
        Req("e", [0], 4),  # no hit: the root's own request, last
        Req("f", [1, 2, 9], 5),  # [1 2] itself
    ]
    ordered = SchedulePolicy("dfs-weight", cache).order(reqs)
    assert names(ordered) == ["c", "d", "b", "f", "a", "e"]
    assert [r.matched_len for r in reqs] == [2, 3, 4, 4, 0, 2]
    assert cache.pretty() == before


def test_aging_puts_a_starving_zero_hit_request_first():
    prompt = list(range(100, 108))
    cache = cache_with(prompt)
    policy = SchedulePolicy("lpm", cache, max_wait_steps=3)
    cold = Req("cold", [0, 1, 2], arrival_step=0)
    waiting = [cold]
    for step in range(4):  # a stream of high-hit requests, one admitted per step
        waiting.append(Req(f"hot{step}", prompt + [step], arrival_step=policy.now_step))
        ordered = policy.order(waiting)
        assert ordered[-1] is cold and cold.matched_len == 0
        waiting.remove(ordered[0])
        policy.step()
    waiting.append(Req("hot4", prompt + [4], arrival_step=policy.now_step))
    assert policy.now_step == 4  # cold has now waited more than 3 steps
    assert policy.order(waiting)[0] is cold


def test_overdue_requests_go_first_in_arrival_order_under_any_policy():
    cache = cache_with([1, 2, 3])
    for name in ("lpm", "dfs-weight", "fcfs", "random"):
        policy = SchedulePolicy(name, cache, max_wait_steps=2)
        policy.now_step = 10
        reqs = [Req("new", [1, 2, 3], 9), Req("old2", [5], 7), Req("new2", [1, 2], 10), Req("old1", [6], 3)]
        assert names(policy.order(reqs)[:2]) == ["old1", "old2"], name


def test_lpm_matches_only_the_oldest_candidates():
    cache = cache_with([1, 2, 3])
    policy = SchedulePolicy("lpm", cache, max_match_candidates=2)
    reqs = [Req("a", [9], 0), Req("b", [1], 1), Req("c", [1, 2, 3], 2)]
    assert names(policy.order(reqs)) == ["b", "a", "c"]
    assert reqs[2].matched_len == 0


# ---- The schedule policy at the edges the policy tests left open: its argument checks, the default bound
# on matched candidates, matched_len written for overdue requests too, and dfs-weight's tie-break between
# a subtree and a leaf of equal weight (survivors of the mutation run on vlserve/scheduler/policy.py:
# benchmarks/results/mutation_policy_fast.md). ----


def test_the_argument_checks_accept_their_smallest_values_and_say_what_is_wrong():
    cache = cache_with()
    SchedulePolicy("lpm", cache, max_wait_steps=0, max_match_candidates=1)  # both allowed
    with pytest.raises(ValueError, match=r"^max_wait_steps must be >= 0, got -1$"):
        SchedulePolicy("lpm", cache, max_wait_steps=-1)
    with pytest.raises(ValueError, match=r"^max_match_candidates must be >= 1, got 0$"):
        SchedulePolicy("lpm", cache, max_match_candidates=0)


def test_with_max_wait_steps_0_a_request_is_overdue_after_one_step():
    policy = SchedulePolicy("lpm", cache_with([1, 2, 3]), max_wait_steps=0)
    cold, hot = Req("cold", [9], 0), Req("hot", [1, 2, 3, 4], 0)
    assert names(policy.order([cold, hot])) == ["hot", "cold"]  # neither has waited yet
    policy.step()
    assert names(policy.order([cold, hot])) == ["cold", "hot"]  # both overdue: arrival order


def test_by_default_the_oldest_1024_requests_are_matched():
    cache = cache_with([1, 2, 3])
    reqs = [Req(f"r{i}", [9, i], i) for i in range(1024)] + [Req("hit", [1, 2, 3, 4], 1024)]
    ordered = SchedulePolicy("lpm", cache).order(reqs)
    assert ordered[-1].name == "hit" and reqs[-1].matched_len == 0  # the 1025th is not matched
    ordered = SchedulePolicy("lpm", cache).order(reqs[1:])
    assert ordered[0].name == "hit" and reqs[-1].matched_len == 3


def test_overdue_requests_get_their_matched_len_too():
    policy = SchedulePolicy("lpm", cache_with([1, 2, 3]), max_wait_steps=1)
    policy.now_step = 5
    old, new = Req("old", [1, 2, 9], 0), Req("new", [1, 2, 3, 9], 5)
    assert names(policy.order([new, old])) == ["old", "new"]
    assert (old.matched_len, new.matched_len) == (2, 3)


def test_dfs_weight_breaks_a_weight_tie_between_a_subtree_and_a_leaf_by_arrival():
    cache = cache_with([1, 2, 3, 4], [7, 8])
    reqs = [
        Req("a", [1, 2, 9], 0),  # [1 2]
        Req("b", [1, 2, 3, 4, 9], 1),  # [1 2] -> [3 4]
        Req("c", [7, 8, 9], 2),  # [7 8]
        Req("d", [7, 8, 5], 3),  # [7 8]
    ]
    # [1 2] (a subtree) and [7 8] (a leaf) both weigh 2: the one whose first request came first leads
    assert names(SchedulePolicy("dfs-weight", cache).order(reqs)) == ["b", "a", "c", "d"]
    for r, arrival in zip(reqs, (2, 3, 0, 1)):  # now c and d came first
        r.arrival_step = arrival
    assert names(SchedulePolicy("dfs-weight", cache).order(reqs)) == ["c", "d", "b", "a"]
