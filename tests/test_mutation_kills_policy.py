"""The schedule policy at the edges the policy tests left open: its argument checks, the default
bound on matched candidates, matched_len written for overdue requests too, and dfs-weight's
tie-break between a subtree and a leaf of equal weight (survivors of the mutation run on
vlserve/scheduler/policy.py: benchmarks/results/mutation_policy_fast.md)."""

import pytest

from test_schedule_policy import Req, cache_with, names
from vlserve.scheduler.policy import SchedulePolicy


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
