"""PrefillAdmission's budgets at their edges, on a small pool: the token budget shared by one round's
admissions, the decode reserves of running and just-admitted requests, a full row table, and which
running requests count as still prefilling for shared-prefix deferral (survivors of the fast mutation
run on vlserve/scheduler/prefill.py: benchmarks/results/mutation_prefill_fast.md)."""

import pytest

from test_mutation_kills_admission import CAPACITY, admission, computed, manager
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
