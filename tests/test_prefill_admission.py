"""PrefillAdmission's budgets at their edges, on a small pool: the token budget shared by one round's
admissions, the decode reserves of running and just-admitted requests, a full row table, and which
running requests count as still prefilling for shared-prefix deferral (survivors of the fast mutation
run on vlserve/scheduler/prefill.py: benchmarks/results/mutation_prefill_fast.md)."""

import pytest

from helpers.small_kv_pool import CAPACITY, admission, computed, manager
from vlserve.core.request import Req
from vlserve.core.sampling_params import SamplingParams


def waiting(rid: str, first_id: int, prompt_len: int, max_new_tokens: int = 2) -> Req:
    return Req(rid, list(range(first_id, first_id + prompt_len)), SamplingParams(max_new_tokens=max_new_tokens))


def planned(plan) -> list[tuple[str, int]]:
    return [(p.req.rid, p.num_tokens) for p in plan]


@pytest.mark.parametrize("budget, expected", [(0, []), (1, [("a", 1)]), (10, [("a", 6), ("b", 4)])])
def test_one_rounds_admissions_share_its_token_budget(budget, expected):
    cm = manager()
    reqs = [waiting("a", 100, 6), waiting("b", 200, 6)]
    assert planned(admission(cm).admit(reqs, [], token_budget=budget)) == expected
    left_out = [r for r in reqs if r.rid not in dict(expected)]
    assert all(r.req_row is None for r in left_out)  # not admitted: no row, no locks


def test_admission_stops_at_a_full_row_table_with_what_it_planned():
    cm = manager(rows=1)
    plan = admission(cm).admit([waiting("a", 100, 4), waiting("b", 200, 4)], [], token_budget=64)
    assert planned(plan) == [("a", 4)]


@pytest.mark.parametrize("max_new_tokens, admitted", [(24, True), (26, False)])
def test_the_reserves_of_running_and_just_admitted_requests_are_held_back(max_new_tokens, admitted):
    # running: 4 slots, reserve 8 * 0.5 = 4; a: 4 slots, reserve 4; so b may need 32 - 8 - 4 - 4 = 16
    cm = manager(rows=3)
    running = computed(cm, [1, 2, 3, 4])
    running.sampling.max_new_tokens = 8
    a, b = waiting("a", 100, 4, max_new_tokens=8), waiting("b", 200, 4, max_new_tokens=max_new_tokens)
    plan = admission(cm).admit([a, b], [running], token_budget=64)
    assert planned(plan) == [("a", 4)] + ([("b", 4)] if admitted else [])  # b needs 4 + 12 or 4 + 13
    assert cm.allocator.num_free_slots == CAPACITY - 8 - 4 * admitted


def test_a_request_still_in_chunked_prefill_holds_back_those_sharing_its_prompt():
    cm = manager()
    prompt = list(range(1, 11))
    chunked = Req("chunked", prompt, SamplingParams(max_new_tokens=2))
    assert cm.admit(chunked)
    cm.advance(chunked, len(cm.alloc(chunked, 8)))
    cm.cache_prefix(chunked)  # the scheduler shares each chunk: the tree holds 8, positions 8, 9 pending
    assert chunked.pending_len == 2
    follower = Req("follower", prompt + [99], SamplingParams(max_new_tokens=2))
    plan = admission(cm, prefix_share_threshold=1).admit([follower], [chunked], token_budget=64)
    assert plan == [] and follower.req_row is None  # 2 uncached shared tokens >= the threshold 1: it waits


def test_a_decoding_request_holds_back_no_one():
    cm = manager()
    prompt = list(range(1, 9))
    decoding = computed(cm, prompt)
    decoding.sampling.max_new_tokens = 2
    cm.cache_prefix(decoding)
    decoding.output_ids = [42]  # sampled, its KV computed by the next decode step
    assert decoding.pending_len == 1
    follower = Req("follower", prompt + [42, 43], SamplingParams(max_new_tokens=2))
    plan = admission(cm, prefix_share_threshold=1).admit([follower], [decoding], token_budget=64)
    assert planned(plan) == [("follower", 2)]  # the tree's 8 hit; token 42's KV is not on its way


# ---- PrefillAdmission's decode reserve and in-batch prefix sharing, directly on a small pool (survivors
# of the mutation run on vlserve/scheduler/prefill.py: benchmarks/results/mutation_admission.md) -------


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
