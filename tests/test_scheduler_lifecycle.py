"""The scheduler driven step by step without a model: a stub runner samples a fixed token for every
planned extend that asks for one, so each edge of schedule() and process() is set exactly — token
budgets, retraction, the context and pool guards, timeouts, shutdown, failures, gauges (survivors of
the mutation run on vlserve/scheduler/scheduler.py: benchmarks/results/mutation_scheduler_loop.md)."""

import dataclasses
import logging
import time

import torch

from vlserve.core.config import MemoryConfig, SchedulerConfig
from vlserve.core.forward_batch import ForwardMode
from vlserve.core.request import Req
from vlserve.core.sampling_params import SamplingParams
from vlserve.core.step import SampledToken, StepResult
from vlserve.memory.pools import KVMemory, KVShape
from vlserve.metrics import Metrics
from vlserve.scheduler.finish import FinishChecker
from vlserve.scheduler.scheduler import Scheduler

TOKEN = 7  # what the stub runner samples; EOS is 0


def scheduler(capacity: int = 64, context_len: int = 32, clock=time.monotonic, **overrides) -> Scheduler:
    memory = KVMemory.create(KVShape(1, 1, 4, torch.float32), MemoryConfig(
        max_total_tokens=capacity, page_size=1, max_running_requests=4, context_length=context_len))
    cfg = SchedulerConfig(schedule_policy="fcfs", disable_radix_cache=False, chunked_prefill_size=16,
                          max_running_requests=4, new_token_ratio=0.5, max_wait_steps=8, prefix_share_threshold=0,
                          disable_jump_forward=False, log_requests=False, request_timeout=None)
    return Scheduler(memory, dataclasses.replace(cfg, **overrides), Metrics(), FinishChecker(None, (0,)), clock=clock)


def submit(s: Scheduler, rid: str, prompt_len: int, max_new_tokens: int = 4, first_id: int = 100) -> tuple[Req, list]:
    req = Req(rid, list(range(first_id, first_id + prompt_len)), SamplingParams(max_new_tokens=max_new_tokens))
    outputs = []
    req.sink = outputs.append
    s.add(req)
    return req, outputs


def step(s: Scheduler) -> list:
    """One schedule → stub forward → process; returns the plan as (rid, num_tokens, sample)."""
    plan = s.schedule()
    sampled = [SampledToken(TOKEN, -0.25) if p.sample else None for p in plan]
    s.process(StepResult(plan, ForwardMode.EXTEND, sampled, [None] * len(plan), [[] for _ in plan]))
    return [(p.req.rid, p.num_tokens, p.sample) for p in plan]


def gauges(s: Scheduler) -> dict:
    m = s.metrics
    return {**{k: m.value(m.kv_tokens, state=k) for k in ("free", "cached", "in_use")},
            "waiting": m.value(m.waiting), "running": m.value(m.running)}


def assert_idle(s: Scheduler) -> None:
    assert s.idle
    s.cm.check_idle_accounting()
    s.cm.cache.check_integrity()


def test_a_request_runs_prefill_then_decodes_and_ends_by_length():
    s = scheduler()
    req, outputs = submit(s, "a", 5, max_new_tokens=3)
    assert step(s) == [("a", 5, True)]
    assert step(s) == [("a", 1, True)]
    assert step(s) == [("a", 1, True)]
    assert req.output_ids == [TOKEN] * 3 and req.finish_reason == "length"
    assert [o.new_ids for o in outputs] == [[TOKEN]] * 3 and [o.finished for o in outputs] == [False, False, True]
    assert_idle(s)


def test_a_chunked_prefill_takes_the_budget_a_decode_does_not():
    s = scheduler(chunked_prefill_size=8)
    submit(s, "long", 20, max_new_tokens=2)
    assert step(s) == [("long", 8, False)]
    submit(s, "short", 3, max_new_tokens=2, first_id=300)
    # the chunk continuation takes the whole budget of 8: the short request waits
    assert step(s) == [("long", 8, False)]
    assert step(s) == [("long", 4, True), ("short", 3, True)]  # 4 left of the budget: short fits
    submit(s, "late", 7, max_new_tokens=2, first_id=400)
    # two decodes use none of the budget: the 7-token prompt is admitted whole
    assert step(s) == [("long", 1, True), ("short", 1, True), ("late", 7, True)]


def test_a_prefill_only_request_is_not_sampled_and_ends_with_length():
    s = scheduler()
    req, outputs = submit(s, "p", 6, max_new_tokens=0)
    assert step(s) == [("p", 6, False)]
    assert req.finish_reason == "length" and req.output_ids == [] and outputs[-1].finished
    assert s.cm.cache.total_size() >= 5  # the prompt is cached for later requests
    assert_idle(s)


def test_positions_past_the_context_end_the_request_with_an_error():
    s = scheduler(context_len=32)
    req, outputs = submit(s, "a", 4, max_new_tokens=8)
    step(s)
    req.kv_len = 32  # a bug upstream: the next decode would write past the row
    req.input_ids += [1] * 28
    plan = s.schedule()
    assert plan == [] and req.finish_reason == "error"
    assert outputs[-1].error == "internal error: 33 positions exceed the context length of 32"


def test_a_request_larger_than_the_pool_fails_alone():
    s = scheduler(capacity=16, context_len=64, chunked_prefill_size=8, new_token_ratio=0.0)
    req, outputs = submit(s, "big", 30, max_new_tokens=2)
    step(s)
    step(s)  # 16 slots taken: the third chunk finds none and nobody else to retract
    step(s)
    assert req.finish_reason == "error"
    assert outputs[-1].error == "the KV pool (16 tokens) is too small for this request (30 tokens)"
    assert_idle(s)


def test_retraction_takes_the_latest_admitted_back_to_the_front_of_the_queue():
    s = scheduler(capacity=24, context_len=64, new_token_ratio=0.0, chunked_prefill_size=32)
    first, _ = submit(s, "first", 10, max_new_tokens=20, first_id=100)
    second, _ = submit(s, "second", 10, max_new_tokens=20, first_id=200)
    assert step(s) == [("first", 10, True), ("second", 10, True)]  # 20 of 24 slots
    queued, _ = submit(s, "queued", 8, max_new_tokens=1, first_id=300)
    assert step(s) == [("first", 1, True), ("second", 1, True)]
    assert step(s) == [("first", 1, True), ("second", 1, True)]  # the pool is full
    second.input_logprobs.append((-1.0, 5))
    # first's decode finds no slot: second (admitted last) is retracted, its KV handed to the tree,
    # and it waits ahead of the request queued before it (it cannot come back this step: its cached
    # prefix is locked again by its own admission, so the pool has 1 slot for the 3 it needs)
    assert step(s) == [("first", 1, True)]
    assert s.running == [first] and s.waiting == [second, queued]
    assert second.req_row is None and second.input_logprobs == [] and second.output_ids == [TOKEN] * 3
    assert s.cm.cache.evictable_size() >= 10  # second's prompt, for its recompute


def test_a_request_past_the_timeout_is_aborted_with_504():
    s = scheduler(request_timeout=30.0)
    old, old_out = submit(s, "old", 5)
    new, _ = submit(s, "new", 5, first_id=300)
    old.arrival_time -= 31
    step(s)
    assert old.finish_reason == "abort" and old_out[-1].error_status == 504
    assert old_out[-1].error == "the request took longer than the server's --request-timeout of 30 s"
    assert new.finish_reason is None and new in s.running


def test_the_timeout_ends_only_requests_older_than_it():
    s = scheduler(request_timeout=30.0, clock=lambda: 1000.0)
    exactly, _ = submit(s, "exactly", 5)
    older, _ = submit(s, "older", 5, first_id=300)
    exactly.arrival_time, older.arrival_time = 970.0, 969.5
    s.schedule()
    assert older.finish_reason == "abort" and exactly.finish_reason is None


def test_end_all_ends_every_queued_request_with_the_status():
    s = scheduler(max_running_requests=1)
    running, r_out = submit(s, "r", 5)
    waiting, w_out = submit(s, "w", 5, first_id=300)
    step(s)
    assert s.running == [running] and s.waiting == [waiting]
    s.end_all("shutting down", 503)
    for req, out in ((running, r_out), (waiting, w_out)):
        assert req.finish_reason == "abort" and out[-1].error == "shutting down" and out[-1].error_status == 503
    assert_idle(s)
    assert gauges(s)["waiting"] == 0 and gauges(s)["running"] == 0


def logged_error(caplog, message: str, error: Exception) -> bool:
    return any(r.levelno == logging.ERROR and r.getMessage() == message and r.exc_info and r.exc_info[1] is error
               for r in caplog.records)


def test_a_failed_forward_frees_its_slots_and_fails_its_requests(caplog):
    s = scheduler()
    req, outputs = submit(s, "a", 6)
    plan = s.schedule()
    boom = RuntimeError("boom")
    with caplog.at_level(logging.ERROR, logger="vlserve.scheduler.scheduler"):
        s.fail(plan, boom)
    assert logged_error(caplog, "forward failed", boom)  # with its traceback
    assert req.finish_reason == "error" and outputs[-1].error == "internal error: boom"
    assert_idle(s)
    assert s.cm.allocator.num_free_slots + s.cm.cache.total_size() == s.cm.capacity


def test_fail_all_ends_waiting_and_running_requests(caplog):
    s = scheduler(max_running_requests=1)
    a, a_out = submit(s, "a", 5)
    b, b_out = submit(s, "b", 5, first_id=300)
    step(s)
    bad = ValueError("bad state")
    with caplog.at_level(logging.ERROR, logger="vlserve.scheduler.scheduler"):
        s.fail_all(bad)
    assert logged_error(caplog, "scheduling step failed", bad)
    assert a_out[-1].error == b_out[-1].error == "internal error: bad state"
    assert a.finish_reason == b.finish_reason == "error"
    assert_idle(s)


def test_aborts_reach_waiting_and_running_requests():
    s = scheduler(max_running_requests=1)
    a, a_out = submit(s, "a", 5)
    b, b_out = submit(s, "b", 5, first_id=300)
    step(s)
    s.abort("a")
    s.abort("b")
    assert s.schedule() == []
    assert a.finish_reason == b.finish_reason == "abort" and a_out[-1].finished and b_out[-1].finished
    assert_idle(s)


def test_the_gauges_follow_the_pool_and_the_queues():
    s = scheduler(capacity=64, max_running_requests=1)
    assert s.metrics.value(s.metrics.kv_capacity) == 64
    submit(s, "a", 6, max_new_tokens=2)
    submit(s, "b", 6, max_new_tokens=2, first_id=300)
    step(s)
    pool = s.cm.pool_state()
    assert gauges(s) == {**pool, "waiting": 1, "running": 1} and pool["in_use"] > 0
    while not s.idle:
        step(s)
    assert s.schedule() == []
    assert gauges(s) == {**s.cm.pool_state(), "waiting": 0, "running": 0}
