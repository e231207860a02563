"""In-batch prefix sharing (vlserve/scheduler/round_sharing.py): a request sharing an uncached prefix
with one admitted before it in the same round borrows that one's slots and joins its forward, or
waits a round where it cannot; and the slot ownership around it (CacheManager.borrow / settle)."""

import pytest
import torch

from vlserve.core.config import MemoryConfig
from vlserve.core.request import Req
from vlserve.core.sampling_params import SamplingParams
from vlserve.memory.pools import KVMemory, KVShape
from vlserve.scheduler.cache_manager import CacheManager
from vlserve.scheduler.policy import SchedulePolicy
from vlserve.scheduler.prefill import PrefillAdmission
from vlserve.scheduler.round_sharing import Borrow, RoundSharing

CAPACITY = 64
SYS = [1, 2, 3]


def req(rid: str, ids: list[int], **kw) -> Req:
    return Req(rid, list(ids), SamplingParams(max_new_tokens=2), **kw)


def manager(page_size: int = 1, rows: int = 4) -> CacheManager:
    cfg = MemoryConfig(max_total_tokens=CAPACITY, page_size=page_size, max_running_requests=rows,
                       context_length=CAPACITY)
    return CacheManager(KVMemory.create(KVShape(1, 1, 4, torch.float32), cfg))


def admission(cm: CacheManager, threshold: int = 4, max_wait_steps: int = 512) -> PrefillAdmission:
    return PrefillAdmission(cm, SchedulePolicy("fcfs", cm.cache, max_wait_steps=max_wait_steps), 0.5,
                            max_running_requests=4, prefix_share_threshold=threshold)


def leader(ids: list[int], kv_len: int, planned_end: int, tree_len: int | None = None) -> Req:
    r = req("leader", ids)
    r.kv_len, r.tree_len = kv_len, kv_len if tree_len is None else tree_len
    return r


# ---- the decision ---------------------------------------------------------------------------------

def test_a_follower_borrows_what_the_leaders_planned_extend_covers():
    sharing = RoundSharing(threshold_tokens=4)
    first = leader(SYS + [10, 11, 12, 13, 14], kv_len=3, planned_end=8)
    sharing.add(first, planned_end=8)
    follower = req("f", SYS + [10, 11, 12, 13, 20])
    assert sharing.lender(follower, cached=3) == Borrow(first, 7)  # shares 4 uncached tokens
    assert sharing.must_wait(follower, cached=3)
    assert RoundSharing(threshold_tokens=5).lender(follower, cached=3) is None
    unrelated = req("u", [10, 11, 12, 13, 20])  # the same tokens, not a shared prefix
    assert sharing.lender(unrelated, cached=0) is None and not sharing.must_wait(unrelated, cached=0)


def test_the_follower_computes_at_least_its_last_token():
    sharing = RoundSharing(threshold_tokens=2)
    first = leader(SYS + [10, 11, 12, 13], kv_len=3, planned_end=7)
    sharing.add(first, planned_end=7)
    same = req("same", SYS + [10, 11, 12, 13])  # the whole prompt shared: its logits are its own
    assert sharing.lender(same, cached=3) == Borrow(first, 6)


def test_no_borrowing_past_the_leaders_chunk_or_across_a_page():
    sharing = RoundSharing(threshold_tokens=4)
    chunked = leader(SYS + list(range(10, 30)), kv_len=3, planned_end=21)  # its chunk ends at 21 of 23
    sharing.add(chunked, planned_end=21)
    follower = req("f", SYS + list(range(10, 30)) + [99])
    assert sharing.lender(follower, cached=3) == Borrow(chunked, 21)  # computes 21, 22 (< 4) and its own
    paged = RoundSharing(threshold_tokens=4, page_size=4)
    paged.add(chunked, planned_end=21)
    assert paged.lender(follower, cached=3) == Borrow(chunked, 20)  # its own slots start a page
    early = RoundSharing(threshold_tokens=4)
    early.add(chunked, planned_end=9)  # 14 shared tokens come in the leader's next chunk: wait for them
    assert early.lender(follower, cached=3) is None and early.must_wait(follower, cached=3)


def test_prompts_in_chunked_prefill_never_lend_and_prompt_logprobs_are_never_borrowed():
    prompt = SYS + [10, 11, 12, 13, 14]
    in_flight = RoundSharing(threshold_tokens=4, in_flight=[prompt])
    follower = req("f", prompt + [20])
    assert in_flight.lender(follower, cached=3) is None and in_flight.must_wait(follower, cached=3)
    sharing = RoundSharing(threshold_tokens=4)
    sharing.add(leader(prompt, kv_len=3, planned_end=8), planned_end=8)
    scored = req("scored", prompt + [20], return_logprob=True, logprob_start_len=0)
    assert sharing.lender(scored, cached=3) is None and sharing.must_wait(scored, cached=3)
    scored_late = req("late", prompt + [20], return_logprob=True, logprob_start_len=8)  # logits from 7 on
    assert sharing.lender(scored_late, cached=3) == Borrow(sharing._leaders[0][0], 7)
    outputs_only = req("outputs", prompt + [20], return_logprob=True)  # logprob_start_len -1: its outputs'
    assert sharing.lender(outputs_only, cached=3) == Borrow(sharing._leaders[0][0], 8)


def test_a_leader_whose_row_holds_tree_slots_there_does_not_lend():
    sharing = RoundSharing(threshold_tokens=2)
    first = leader(SYS + [10, 11, 12, 13], kv_len=5, planned_end=7, tree_len=5)
    sharing.add(first, planned_end=7)
    capped = req("capped", SYS + [10, 11, 12, 13, 14])
    assert sharing.lender(capped, cached=3) is None  # positions 3, 4 are the leader's tree slots


def test_the_threshold_must_be_positive():
    with pytest.raises(ValueError, match="threshold_tokens"):
        RoundSharing(threshold_tokens=0)


# ---- admission and ownership ---------------------------------------------------------------------

def two() -> list[Req]:
    prompt = list(range(1, 9))
    return [req("a", prompt + [20]), req("b", prompt + [21])]


def test_the_follower_joins_the_same_step_computing_only_its_own_tokens():
    cm = manager()
    a, b = two()
    plan = admission(cm).admit([a, b], [], token_budget=64)
    assert [(p.req.rid, p.num_tokens) for p in plan] == [("a", 9), ("b", 1)]
    assert b.borrowed == (0, 8) and b.kv_len == 8 and b.tree_len == 0 and b.cached_tokens == 8
    assert torch.equal(cm.rows.read(b.req_row, 0, 8), cm.rows.read(a.req_row, 0, 8))
    assert cm.allocator.num_free_slots == CAPACITY - 10  # 9 for a, 1 for b: the prefix once


def test_settling_locks_the_leaders_kv_in_the_tree_and_nothing_leaks():
    cm = manager()
    a, b = two()
    plan = admission(cm).admit([a, b], [], token_budget=64)
    for p in plan:  # as Scheduler.process: the leader first
        cm.advance(p.req, p.num_tokens)
        assert cm.settle(p.req)
        cm.cache_prefix(p.req)
    assert b.borrowed is None and b.tree_len == 9 and a.tree_len == 9 - 0  # b's own token 21 too
    assert torch.equal(cm.rows.read(b.req_row, 0, 8), cm.rows.read(a.req_row, 0, 8))
    assert cm.cache.protected_size() == 8 + 1 + 1  # the shared 8, and each one's last token
    cm.release(a)
    cm.release(b)
    cm.check_idle_accounting()
    assert cm.cache.total_size() == 10


def test_a_failed_forward_frees_each_slot_once():
    cm = manager()
    a, b = two()
    plan = admission(cm).admit([a, b], [], token_budget=64)
    for p in plan:  # as Scheduler.fail
        cm.drop_uncomputed(p.req, p.num_tokens)
        cm.release(p.req)
    assert b.borrowed is None
    cm.check_idle_accounting()
    assert cm.allocator.num_free_slots == CAPACITY  # nothing reached the tree, nothing freed twice


def test_a_follower_released_before_its_step_leaves_the_leaders_slots_alone():
    cm = manager()
    a, b = two()
    assert cm.admit(a)
    cm.alloc(a, 9)
    assert cm.admit(b)
    cm.borrow(b, a, 8)
    cm.release(b)  # as admission does when b's own allocation fails
    assert cm.allocator.num_free_slots == CAPACITY - 9 and b.req_row is None  # a's 9 untouched
    cm.advance(a, 9)
    cm.release(a)
    cm.check_idle_accounting()


def test_settle_without_the_leaders_kv_drops_the_borrowed_range():
    cm = manager()
    a, b = two()
    plan = admission(cm).admit([a, b], [], token_budget=64)
    cm.advance(b, plan[1].num_tokens)
    assert not cm.settle(b)  # processed before its leader: the tree lacks positions 0..7
    assert b.kv_len == 0 and b.borrowed is None
    cm.release(b)
    cm.advance(a, 9)
    cm.release(a)
    cm.check_idle_accounting()


def test_an_overdue_request_never_waits_and_one_that_cannot_borrow_does():
    prompt = list(range(1, 17))
    cm = manager()
    chunked = req("chunked", prompt)
    assert cm.admit(chunked)
    cm.advance(chunked, len(cm.alloc(chunked, 8)))
    cm.cache_prefix(chunked)  # positions 8..15 are still to come, in a later chunk
    waiting = admission(cm).admit([req("f", prompt + [99])], [chunked], token_budget=64)
    assert waiting == []
    adm = admission(cm, max_wait_steps=0)
    late = req("late", prompt + [99])
    adm.policy.now_step = 5
    plan = adm.admit([late], [chunked], token_budget=64)
    assert [(p.req.rid, p.num_tokens) for p in plan] == [("late", 9)]  # computes 8..16 itself


# ---- edges the mutation run found untested (benchmarks/results/mutation_round_sharing.md) ---------

def test_a_threshold_of_one_token_is_allowed():
    assert RoundSharing(threshold_tokens=1).threshold == 1


def test_the_lender_is_the_leader_that_reached_the_last_shared_position():
    sharing = RoundSharing(threshold_tokens=2)
    first = leader(SYS + [10, 11, 12, 13], kv_len=3, planned_end=7)
    longer = leader(SYS + [10, 11, 12, 13, 14, 15, 16], kv_len=3, planned_end=10)
    sharing.add(first, planned_end=7)
    sharing.add(longer, planned_end=10)  # positions 0..6 were inserted by `first`, 7..9 by it
    follower = req("f", SYS + [10, 11, 12, 13, 14, 99])
    assert sharing.lender(follower, cached=3) == Borrow(longer, 8)


def test_exactly_threshold_tokens_left_for_the_leaders_next_chunk_means_wait():
    sharing = RoundSharing(threshold_tokens=4)
    chunked = leader(SYS + list(range(10, 30)), kv_len=3, planned_end=19)
    sharing.add(chunked, planned_end=19)
    follower = req("f", SYS + list(range(10, 30)) + [99])  # shares 23: 4 of them after the chunk
    assert sharing.lender(follower, cached=3) is None and sharing.must_wait(follower, cached=3)


def test_the_borrowed_range_ends_where_the_prompts_part():
    sharing = RoundSharing(threshold_tokens=4)
    first = leader(SYS + [10, 11, 12, 13, 14], kv_len=3, planned_end=8)
    sharing.add(first, planned_end=8)
    follower = req("f", SYS + [10, 11, 12, 13, 20, 21, 22])  # parts after position 6
    assert sharing.lender(follower, cached=3) == Borrow(first, 7)


def test_too_little_left_after_clipping_to_the_chunk_is_not_borrowed():
    sharing = RoundSharing(threshold_tokens=4)
    first = leader(SYS + [10, 11, 12, 13, 14], kv_len=3, planned_end=6)  # its chunk ends at 6
    sharing.add(first, planned_end=6)
    follower = req("f", SYS + [10, 11, 12, 13, 20])  # shares 4, of which the chunk covers 3
    assert sharing.lender(follower, cached=3) is None


def test_borrowing_after_a_cache_hit_maps_exactly_the_shared_positions():
    cm = manager()
    cm.release(computed_prompt(cm, [1, 2, 3, 4]))  # 4 tokens cached in the tree
    prompt = [1, 2, 3, 4] + list(range(5, 13))
    a, b = req("a", prompt + [20]), req("b", prompt + [21])
    plan = admission(cm).admit([a, b], [], token_budget=64)
    assert [(p.req.rid, p.num_tokens) for p in plan] == [("a", 9), ("b", 1)]
    assert b.borrowed == (4, 12)
    assert torch.equal(cm.rows.read(b.req_row, 0, 12), cm.rows.read(a.req_row, 0, 12))
    assert not torch.equal(cm.rows.read(b.req_row, 12, 13), cm.rows.read(a.req_row, 12, 13))
    for p in plan:
        cm.advance(p.req, p.num_tokens)
    assert cm.settle(a)
    cm.cache_prefix(a)
    assert cm.settle(b)  # alone, before b's own insert: its row already points at the tree's copy
    assert b.tree_len == 12
    assert torch.equal(cm.rows.read(b.req_row, 0, 12), cm.cache.match_prefix(prompt).indices)


def computed_prompt(cm: CacheManager, ids: list[int]) -> Req:
    r = req("c", ids)
    assert cm.admit(r)
    cm.advance(r, len(cm.alloc(r, r.pending_len)))
    return r
