"""What Scheduler.process does with a step's result, driven without a model: tokens and their
logprobs reach the output, stop tokens are reported, prompt metrics count each prompt once, decode
steps leave the radix tree alone, constrained requests jump forward (a real regex FSM over a small
trained tokenizer) and a failing constraint ends only its own request; plus the two edges of
_alloc_or_retract the first tests left open (survivors of the mutation run on
vlserve/scheduler/scheduler.py: benchmarks/results/mutation_scheduler_fast.md)."""

import dataclasses
import logging

import pytest
import torch
from helpers.constrained_helpers import train_tokenizer
from test_scheduler_lifecycle import TOKEN, assert_idle, gauges, scheduler, step, submit

from vlserve.constrained import ConstraintCompiler, ConstraintState
from vlserve.core.config import MemoryConfig
from vlserve.core.forward_batch import ForwardMode
from vlserve.core.step import SampledToken, StepResult
from vlserve.memory.pools import KVMemory, KVShape
from vlserve.metrics import Metrics
from vlserve.scheduler.finish import FinishChecker
from vlserve.scheduler.scheduler import Scheduler

REGEX = "answer:(yes|no)!!!done"  # forced "answer:", one choice, then forced "es!!!done"


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def step_sampling(s, sampled: dict) -> list:
    """One step where the stub runner samples sampled[rid] (a SampledToken) for the requests named."""
    plan = s.schedule()
    tokens = [(sampled.get(p.req.rid) or SampledToken(TOKEN, -0.25)) if p.sample else None for p in plan]
    s.process(StepResult(plan, ForwardMode.EXTEND, tokens, [None] * len(plan), [[] for _ in plan]))
    return [(p.req.rid, p.num_tokens, p.sample) for p in plan]


def prompt_metrics(s) -> tuple[float, float]:
    return s.metrics.value(s.metrics.prompt_tokens), s.metrics.value(s.metrics.cached_prompt_tokens)


def test_each_prompt_is_counted_once_with_its_exact_cache_hit():
    s = scheduler()
    submit(s, "one", 1, max_new_tokens=2, first_id=50)  # a one-token prompt is a prefill too
    first, _ = submit(s, "first", 6, max_new_tokens=2)
    while not s.idle:
        step(s)
    assert prompt_metrics(s) == (7, 0)  # cold prompts: nothing served from the cache
    again, _ = submit(s, "again", 6, max_new_tokens=2)  # first's prompt, now in the tree
    while not s.idle:
        step(s)
    assert again.cached_tokens == 5  # all but the last prompt token, which must be computed
    assert prompt_metrics(s) == (13, 5)


def test_decode_steps_leave_the_tree_to_the_prefill():
    # jump-forward may rewrite output tokens only while they are not in the tree
    # (ConstraintHooks.after_token): a decode step must not insert what it computed
    s = scheduler()
    req, _ = submit(s, "a", 6, max_new_tokens=5)
    step(s)
    assert (req.tree_len, s.cm.cache.total_size()) == (6, 6)
    for _ in range(3):
        step(s)
        assert (req.tree_len, s.cm.cache.total_size()) == (6, 6)
    step(s)
    assert req.finish_reason == "length"
    assert_idle(s)


def test_sampled_logprobs_and_alternatives_reach_the_output():
    s = scheduler()
    req, outputs = submit(s, "a", 5, max_new_tokens=2)
    top = [(-0.25, TOKEN), (-1.5, 9)]
    step_sampling(s, {"a": SampledToken(TOKEN, -0.25, top)})
    step_sampling(s, {"a": SampledToken(9, -1.5, [(-1.5, 9)])})
    assert req.output_logprobs == [-0.25, -1.5] and req.output_top_logprobs == [top, [(-1.5, 9)]]
    assert [o.new_logprobs for o in outputs] == [[-0.25], [-1.5]]
    assert [o.new_top_logprobs for o in outputs] == [[top], [[(-1.5, 9)]]]


def test_a_stop_token_ends_the_request_and_is_reported():
    s = scheduler()
    req, outputs = submit(s, "a", 5, max_new_tokens=8)
    step(s)
    step_sampling(s, {"a": SampledToken(0, -0.1)})  # EOS is 0 (the test scheduler's FinishChecker)
    assert req.finish_reason == "stop" and req.finish_matched == 0
    assert outputs[-1].finished and outputs[-1].meta["matched_stop"] == 0 and outputs[-1].new_ids == [0]
    assert_idle(s)


def constrained(s, tok, rid: str = "c", prompt_len: int = 5):
    req, outputs = submit(s, rid, prompt_len, max_new_tokens=24)
    req.constraint = ConstraintState(ConstraintCompiler(tok).compile(regex=REGEX))
    return req, outputs


def test_a_constrained_request_jumps_forward_through_the_scheduler(tok):
    s = scheduler()
    req, outputs = constrained(s, tok)
    forced = ids_of(tok, "answer:")
    # prefill; the output starts forced, so nothing is sampled: the forced ids are the output
    assert step(s) == [("c", 5, False)]
    assert req.output_ids == forced and outputs[-1].replace_from == 0 and outputs[-1].new_ids == forced
    assert prompt_metrics(s) == (5, 0)
    # the forced ids are computed in one extend, then "y" is sampled and "es!!!done" forced after it
    y = ids_of(tok, "y")
    assert step_sampling(s, {"c": SampledToken(y[0], -0.5)}) == [("c", len(forced), True)]
    assert tok.decode(req.output_ids) == "answer:yes!!!done"
    # the regex is complete: the request stops, and its last output rewrites the tail from the
    # sampled "y" on (the client had seen the forced ids only)
    assert req.finish_reason == "stop" and outputs[-1].finished
    assert outputs[-1].replace_from == len(forced) and outputs[-1].new_ids == req.output_ids[len(forced):]
    assert req.output_logprobs == [0.0] * len(forced) + [-0.5] + [0.0] * (len(req.output_ids) - len(forced) - 1)
    assert prompt_metrics(s) == (5, 0)  # the extend of the forced ids is no second prompt
    assert_idle(s)


def test_a_failing_constraint_ends_only_its_request(tok, caplog):
    s = scheduler()
    req, outputs = constrained(s, tok)
    other, other_out = submit(s, "other", 5, max_new_tokens=3, first_id=300)
    step(s)  # c's forced prefix, other's first token
    with caplog.at_level(logging.ERROR, logger="vlserve.scheduler.scheduler"):
        step_sampling(s, {"c": SampledToken(ids_of(tok, "x")[0], -0.5)})  # not allowed after "answer:"
    assert req.finish_reason == "error" and outputs[-1].finished
    assert outputs[-1].error.startswith("internal error in the output constraint: token ")
    assert any(r.levelno == logging.ERROR and r.getMessage() == "constraint update failed for request c"
               and r.exc_info for r in caplog.records)
    assert other.finish_reason is None and other.output_ids == [TOKEN, TOKEN] and other_out[-1].new_ids == [TOKEN]
    while not s.idle:
        step(s)
    assert other.finish_reason == "length"
    assert_idle(s)


def test_a_prompt_may_fill_the_context_exactly():
    s = scheduler(context_len=8, chunked_prefill_size=4)
    req, outputs = submit(s, "full", 8, max_new_tokens=0)  # a prefill-only request (prompt + 0 <= context)
    assert step(s) == [("full", 4, False)]
    assert step(s) == [("full", 4, False)]  # positions 4..7: the last one the row holds
    assert req.finish_reason == "length" and outputs[-1].error is None
    assert_idle(s)


def test_the_latest_admitted_request_retracts_itself_when_no_slot_is_left():
    s = scheduler(capacity=21, context_len=64, new_token_ratio=0.0, chunked_prefill_size=32)
    first, _ = submit(s, "first", 10, max_new_tokens=8, first_id=100)
    second, second_out = submit(s, "second", 10, max_new_tokens=8, first_id=200)
    step(s)  # 20 of 21 slots
    # first's decode takes the last slot; second, admitted last, finds none: it goes back to the
    # queue (it is not the only running request, so it must not fail as "too large for the pool")
    assert step(s) == [("first", 1, True)]
    assert s.running == [first] and s.waiting == [second]
    assert second.finish_reason is None and all(o.error is None for o in second_out)


def test_as_many_requests_run_as_the_pool_has_rows():
    # 4 request rows of 3 positions each: the rows, not the context length, bound the running requests
    memory = KVMemory.create(KVShape(1, 1, 4, torch.float32), MemoryConfig(
        max_total_tokens=64, page_size=1, max_running_requests=4, context_length=3))
    s = Scheduler(memory, dataclasses.replace(scheduler().cfg, max_running_requests=8), Metrics(),
                  FinishChecker(None, (0,)))
    for i in range(5):
        submit(s, f"r{i}", 2, max_new_tokens=1, first_id=100 * (i + 1))
    assert [rid for rid, _, _ in step(s)] == ["r0", "r1", "r2", "r3"]
    assert [r.rid for r in s.waiting] == ["r4"]
    while not s.idle:
        step(s)
    assert_idle(s)


def test_with_the_cache_disabled_nothing_is_shared():
    s = scheduler(disable_radix_cache=True)
    for rid in ("a", "b"):
        req, _ = submit(s, rid, 6, max_new_tokens=2)
        while not s.idle:
            step(s)
        assert req.cached_tokens == 0
    assert s.cm.cache.total_size() == 0 and prompt_metrics(s) == (12, 0)
    assert_idle(s)


def test_an_internal_error_is_a_500_counted_as_an_error(caplog):
    s = scheduler()
    req, outputs = submit(s, "a", 6)
    plan = s.schedule()
    with caplog.at_level(logging.ERROR, logger="vlserve.scheduler.scheduler"):
        s.fail(plan, RuntimeError("boom"))
    assert outputs[-1].error_status == 500
    assert s.metrics.value(s.metrics.requests, status="error") == 1
    assert s.metrics.value(s.metrics.requests, status="ok") == 0


def test_log_requests_logs_admission_and_end(caplog):
    s = scheduler(log_requests=True)
    submit(s, "a", 6, max_new_tokens=1)
    with caplog.at_level(logging.INFO, logger="vlserve.requests"):
        step(s)
    lines = [r.getMessage() for r in caplog.records if r.name == "vlserve.requests"]
    assert len(lines) == 2 and lines[0].startswith("request a admitted: 6 prompt tokens")
    assert lines[1].startswith("request a finished (length): 6 prompt tokens")


def test_with_jump_forward_off_a_constrained_output_is_sampled_token_by_token(tok):
    s = scheduler(disable_jump_forward=True)
    req, outputs = constrained(s, tok)
    a = ids_of(tok, "a")
    assert step_sampling(s, {"c": SampledToken(a[0], -0.5)}) == [("c", 5, True)]  # sampled, not forced
    assert req.output_ids == a and outputs[-1].replace_from is None


def test_a_continuation_of_two_tokens_takes_two_of_the_budget():
    s = scheduler(chunked_prefill_size=8)
    submit(s, "long", 10, max_new_tokens=2)
    assert step(s) == [("long", 8, False)]
    submit(s, "next", 7, max_new_tokens=2, first_id=300)
    assert step(s) == [("long", 2, True), ("next", 6, False)]  # 8 - 2 left for the next prompt


def test_a_budget_of_one_token_still_admits():
    s = scheduler(chunked_prefill_size=8)
    submit(s, "long", 15, max_new_tokens=2)
    step(s)
    submit(s, "next", 3, max_new_tokens=2, first_id=300)
    assert step(s) == [("long", 7, True), ("next", 1, False)]


def test_decodes_go_on_when_forced_tails_have_taken_the_budget(tok):
    # a jump's forced ids are computed like a chunk, within the budget; requests after it in the
    # running list still decode, and one left with no budget simply waits for the next step
    s = scheduler(chunked_prefill_size=4)
    j1, _ = constrained(s, tok, "j1", prompt_len=1)
    j2, _ = constrained(s, tok, "j2", prompt_len=1)
    b, b_out = submit(s, "b", 2, max_new_tokens=4, first_id=300)
    assert step(s) == [("j1", 1, False), ("j2", 1, False), ("b", 2, True)]
    forced = len(ids_of(tok, "answer:"))
    assert len(j1.output_ids) == len(j2.output_ids) == forced > 4
    assert step(s) == [("j1", 4, False), ("b", 1, True)]  # j2: no budget left, no empty extend
    assert b.output_ids == [TOKEN, TOKEN] and b_out[-1].new_ids == [TOKEN]
    assert j2.kv_len == 1 and j1.kv_len == 5


def test_a_step_with_nothing_to_run_still_updates_the_gauges():
    s = scheduler(max_running_requests=1)
    submit(s, "a", 5)
    submit(s, "b", 5, first_id=300)
    step(s)
    assert gauges(s)["running"] == 1 and gauges(s)["waiting"] == 1
    s.abort("a")
    s.abort("b")
    assert s.schedule() == []  # no forward, so no process(): schedule itself reports the change
    assert gauges(s) == {**s.cm.pool_state(), "waiting": 0, "running": 0}


def test_a_forced_tail_is_shared_in_the_tree_once_computed(tok):
    # like a prompt, the forced ids of a jump are computed in one extend and then cached at once
    s = scheduler()
    req, _ = submit(s, "c", 5, max_new_tokens=8)
    req.constraint = ConstraintState(ConstraintCompiler(tok).compile(regex="(x|y)do(a|b)(c|d)"))
    x, a = ids_of(tok, "x")[0], ids_of(tok, "a")[0]
    step_sampling(s, {"c": SampledToken(x, -0.5)})
    assert tok.decode(req.output_ids) == "xdo" and len(req.output_ids) == 2  # "do" forced: one token
    assert step_sampling(s, {"c": SampledToken(a, -0.5)}) == [("c", 2, True)]
    assert req.tree_len == 7 and s.cm.cache.total_size() == 7  # the prompt, "x" and "do"
    assert req.finish_reason is None and tok.decode(req.output_ids) == "xdoa"


def test_an_abort_ends_only_its_own_request():
    s = scheduler(max_running_requests=2)
    a, _ = submit(s, "a", 5, max_new_tokens=4)
    b, _ = submit(s, "b", 5, max_new_tokens=4, first_id=300)
    w, _ = submit(s, "w", 5, max_new_tokens=4, first_id=500)
    step(s)
    s.abort("b")
    assert step(s) == [("a", 1, True), ("w", 5, True)]  # b's place goes to the waiting request
    assert b.finish_reason == "abort" and a.finish_reason is None and w.finish_reason is None
    s.abort("w")
    assert step(s) == [("a", 1, True)]
    assert w.finish_reason == "abort" and a.finish_reason is None
    while not s.idle:
        step(s)
    assert a.finish_reason == "length" and a.output_ids == [TOKEN] * 4
    assert_idle(s)
