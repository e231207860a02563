"""The scheduler: which requests advance this step (schedule), and what follows (process).

    plan = scheduler.schedule()      # aborts, decodes, chunk continuations, retraction, admissions
    result = runner.run(plan)        # vlserve/runner: the forward and sampling
    scheduler.process(result)        # KV bookkeeping, tokens, constraints, finish checks, outputs

Continuous batching: every running request advances every step — decodes by one token, a chunked
prefill by up to the remaining token budget — and new requests join in the same forward (a decode
is an extend of one token, so prefills and decodes share one batched call).
"""

import logging
import queue
import time
from collections.abc import Callable

import torch

from vlserve.core.config import SchedulerConfig
from vlserve.core.request import Req
from vlserve.core.step import PlannedExtend, SampledToken, StepResult
from vlserve.memory.allocator import OutOfSlots
from vlserve.memory.pools import KVMemory
from vlserve.metrics import Metrics
from vlserve.scheduler.cache_manager import CacheManager
from vlserve.scheduler.constraints import ConstraintHooks
from vlserve.scheduler.finish import FinishChecker
from vlserve.scheduler.mixed_budget import MixedStepBudget
from vlserve.scheduler.outputs import step_output
from vlserve.scheduler.policy import SchedulePolicy
from vlserve.scheduler.prefill import PrefillAdmission
from vlserve.scheduler.request_stats import RequestStats
from vlserve.scheduler.vision_budget import VisionBudget

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, memory: KVMemory, cfg: SchedulerConfig, metrics: Metrics, finish: FinishChecker,
                 clock: Callable[[], float] = time.monotonic):
        """clock: seconds on the clock requests' arrival_time is read from (timeouts, latencies)."""
        self.cfg, self.metrics, self.finish_checker, self.clock = cfg, metrics, finish, clock
        self.stats = RequestStats(metrics, cfg.log_requests)
        self.context_len = memory.context_len
        self.cm = CacheManager(memory, cfg.disable_radix_cache)
        self.policy = SchedulePolicy(cfg.schedule_policy, self.cm.cache, cfg.max_wait_steps)
        max_running = min(cfg.max_running_requests, memory.req_to_token.table.shape[0])
        self.admission = PrefillAdmission(self.cm, self.policy, cfg.new_token_ratio, max_running,
                                          cfg.prefix_share_threshold)
        self.constraints = ConstraintHooks(self.cm, self.context_len, jump_forward=not cfg.disable_jump_forward)
        self.mixed = MixedStepBudget(cfg.mixed_prefill_ratio, cfg.chunked_prefill_size)
        self._planned_at: float | None = None  # when the plan in flight was handed out (its step's timing)
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        metrics.kv_capacity.set(self.cm.capacity)

    # ---- requests in and out ------------------------------------------------------------------
    def add(self, req: Req) -> None:
        req.arrival_step = self.policy.now_step
        self.waiting.append(req)

    def abort(self, rid: str) -> None:
        """Thread-safe; takes effect at the start of the next schedule()."""
        self._aborts.put(rid)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- schedule -----------------------------------------------------------------------------
    def schedule(self) -> list[PlannedExtend]:
        self._process_aborts()
        if self.cfg.request_timeout:
            self._expire(self.clock() - self.cfg.request_timeout)
        self.policy.step()
        plan, budget = [], self.mixed.tokens(decoding=any(r.pending_len == 1 for r in self.running))
        vision = VisionBudget(self.cfg.max_num_encoder_input_tokens)
        for req in list(self.running):
            if req not in self.running:  # retracted to make room for an earlier request
                continue
            n = 1 if req.pending_len == 1 else vision.cap(req, min(req.pending_len, budget))
            if n <= 0:
                continue
            slots = self._alloc_or_retract(req, n)
            if slots is not None:
                plan.append(PlannedExtend(req, n, slots))
                budget -= n if n > 1 else 0
        if self.waiting and budget > 0:
            admitted = self.admission.admit(self.waiting, self.running, budget, vision)
            now = self.clock()
            for p in admitted:
                self.waiting.remove(p.req)
                self.running.append(p.req)
                self.stats.admitted(p.req, now)
            plan += admitted
        for p in plan:
            self._decide_sampling(p)
        if not plan:
            self._update_gauges()
        self._planned_at = self.clock() if plan else None
        return plan

    def _decide_sampling(self, p: PlannedExtend) -> None:
        """Whether the token after this extend is sampled, or forced by the request's constraint."""
        req = p.req
        if req.kv_len + p.num_tokens < req.seq_len or req.sampling.max_new_tokens == 0:
            return
        p.jump = self.constraints.first_jump(req)
        p.sample = p.jump is None

    def _alloc_or_retract(self, req: Req, n: int) -> torch.Tensor | None:
        """Allocates; on OOM retracts the most recently admitted request (maybe req itself)."""
        if req.kv_len + n > self.context_len:  # a bug upstream: never write past the request's row
            self._finish(req, "error", error=f"internal error: {req.kv_len + n} positions exceed the context "
                                             f"length of {self.context_len}")
            return None
        while True:
            try:
                return self.cm.alloc(req, n)
            except OutOfSlots:
                victim = self.running[-1]
                if victim is req and len(self.running) == 1:
                    self._finish(req, "error", error=f"the KV pool ({self.cm.capacity} tokens) is too small "
                                                     f"for this request ({req.seq_len} tokens)")
                    return None
                self._retract(victim)
                if victim is req:
                    return None

    def _retract(self, req: Req) -> None:
        self.cm.release(req)  # its KV goes to the tree, so the recompute is mostly a cache hit
        self.running.remove(req)
        req.input_logprobs.clear()  # recomputed from logprob_start_len on re-admission
        self.waiting.insert(0, req)

    # ---- process ------------------------------------------------------------------------------
    def process(self, result: StepResult) -> None:
        now = self.clock()
        self._time_step(result.plan, now)
        for p, sampled, error, input_lps in zip(result.plan, result.sampled, result.sample_errors,
                                                result.input_logprobs):
            req = p.req
            was_prefill = req.pending_len > 1 or not req.output_ids
            req.input_logprobs.extend(input_lps)
            self.cm.advance(req, p.num_tokens)
            if not self.cm.settle(req):  # its lender, planned before it, is processed by now
                self._finish(req, "error", error="internal error: the KV this request shared with another "
                                                 "request of its batch is gone")
                continue
            if req.kv_len < req.seq_len:
                # A chunk of a longer prefill: share it now, so requests with the same long prefix
                # (questions on one video) admitted next step hit it instead of recomputing it.
                self.cm.cache_prefix(req)
                continue
            if was_prefill:
                self._on_prefill_done(req)
            if req.sampling.max_new_tokens == 0:
                self._finish(req, "length")
            elif p.jump is not None:
                self.constraints.apply_first_jump(req, p.jump)
                self._after_output_changed(req, replace_from=0)  # else the forced prefix is extended next step
            elif error is not None:
                self._finish(req, "error", error=error.message, error_status=error.status)
            elif sampled is not None:
                self._on_token(req, sampled, now)
        self._update_gauges()

    def _time_step(self, plan: list[PlannedExtend], now: float) -> None:
        """The step's cost, for the next steps' prefill budget beside decodes (mixed_budget.py)."""
        if self._planned_at is not None and now > self._planned_at:
            decodes = sum(p.num_tokens == 1 for p in plan)
            self.mixed.observe(now - self._planned_at, decodes, sum(p.num_tokens for p in plan if p.num_tokens > 1))
        self._planned_at = None

    def end_all(self, message: str, status: int) -> None:
        """Ends every queued request with this error (the server is shutting down)."""
        for req in self.running + self.waiting:
            if not req.finished:
                self._finish(req, "abort", error=message, error_status=status)
        self._update_gauges()

    def _expire(self, arrived_before: float) -> None:
        for req in self.running + self.waiting:
            if req.arrival_time < arrived_before and not req.finished:
                self._finish(req, "abort", error=f"the request took longer than the server's --request-timeout of "
                                                 f"{self.cfg.request_timeout:g} s", error_status=504)

    def fail_all(self, error: Exception) -> None:
        """A bug outside the forward (in schedule or process): every request still here ends with an
        error rather than wait forever on a loop that fails the same way each step."""
        log.error("scheduling step failed", exc_info=error)
        for req in self.running + self.waiting:
            if not req.finished:
                self._finish(req, "error", error=f"internal error: {error}")
        self._update_gauges()

    def fail(self, plan: list[PlannedExtend], error: Exception) -> None:
        """The step's forward raised: its requests fail (with their uncomputed slots freed), the
        engine goes on."""
        log.error("forward failed", exc_info=error)
        for p in plan:
            if not p.req.finished:
                self.cm.drop_uncomputed(p.req, p.num_tokens)
                self._finish(p.req, "error", error=f"internal error: {error}")
        self._update_gauges()

    def _on_prefill_done(self, req: Req) -> None:
        if req.first_token_time is None and not req.output_ids:
            self.metrics.prompt_tokens.inc(len(req.input_ids))
            self.metrics.cached_prompt_tokens.inc(max(0, req.cached_tokens))
        self.cm.cache_prefix(req)

    def _on_token(self, req: Req, sampled: SampledToken, now: float) -> None:
        req.output_ids.append(sampled.token)
        req.output_logprobs.append(sampled.logprob)
        req.output_top_logprobs.append(sampled.top)
        self.stats.token(req, now)
        try:
            replace_from = self.constraints.after_token(req, sampled.token)
        except Exception as e:  # one request's constraint must not fail the others in the batch
            log.exception("constraint update failed for request %s", req.rid)
            self._finish(req, "error", error=f"internal error in the output constraint: {e}")
            return
        self._after_output_changed(req, replace_from)

    def _after_output_changed(self, req: Req, replace_from: int | None) -> None:
        finish = self.finish_checker.check(req, self.context_len)
        if finish:
            req.finish_matched = finish[1]
            self._finish(req, finish[0], replace_from=replace_from)
        else:
            self._emit(req, finished=False, replace_from=replace_from)

    # ---- ending requests ----------------------------------------------------------------------
    def _finish(self, req: Req, reason: str, error: str | None = None, replace_from: int | None = None,
                error_status: int = 500) -> None:
        req.finish_reason = reason
        self.cm.release(req)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.stats.finished(req, self.clock(), error)
        self._emit(req, finished=True, error=error, replace_from=replace_from, error_status=error_status)

    def _emit(self, req: Req, finished: bool, error: str | None = None, replace_from: int | None = None,
              error_status: int = 500) -> None:
        if req.sink is not None:
            req.sink(step_output(req, finished, error, replace_from, error_status))

    def _process_aborts(self) -> None:
        while not self._aborts.empty():
            rid = self._aborts.get()
            for req in self.waiting + self.running:
                if req.rid == rid and not req.finished:
                    self._finish(req, "abort")

    def _update_gauges(self) -> None:
        for state, n in self.cm.pool_state().items():
            self.metrics.kv_tokens.labels(state=state).set(n)
        self.metrics.waiting.set(len(self.waiting))
        self.metrics.running.set(len(self.running))
