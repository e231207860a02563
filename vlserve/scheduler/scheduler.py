"""One scheduling step: plan (decodes, chunk continuations, admissions) → forward → sample → outputs.

Continuous batching: every running request advances every step — decodes by one token, a chunked
prefill by up to the remaining token budget — and new requests join in the same forward (a decode
is an extend of one token, so prefills and decodes share one batched call).
"""

import logging
import queue
import time
from dataclasses import dataclass

import torch

from vlserve.cache.vision_cache import VisionEmbeddingCache
from vlserve.engine.batch import ExtendSlice, build_forward_batch
from vlserve.engine.image_embedder import ImageEmbedder
from vlserve.engine.model_runner import ModelRunner
from vlserve.engine.request import Req, StepOutput
from vlserve.memory.allocator import OutOfSlots
from vlserve.metrics import Metrics
from vlserve.sampling.sampler import sample
from vlserve.scheduler.cache_manager import CacheManager
from vlserve.scheduler.finish import FinishChecker
from vlserve.scheduler.policy import SchedulePolicy
from vlserve.scheduler.prefill import PlannedExtend, PrefillAdmission

log = logging.getLogger(__name__)


@dataclass
class SchedulerConfig:
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    chunked_prefill_size: int = 2048
    max_running_requests: int = 128
    new_token_ratio: float = 0.4
    max_wait_steps: int = 512
    prefix_share_threshold: int = 4  # low: a deferred request waits one step; a missed prefix costs compute
    vision_cache_mb: float = 256.0


class Scheduler:
    def __init__(self, runner: ModelRunner, cfg: SchedulerConfig, metrics: Metrics, finish: FinishChecker,
                 constraints=None):
        self.runner, self.cfg, self.metrics, self.finish_checker = runner, cfg, metrics, finish
        self.cm = CacheManager(runner, cfg.disable_radix_cache)
        self.policy = SchedulePolicy(cfg.schedule_policy, self.cm.cache, cfg.max_wait_steps)
        max_running = min(cfg.max_running_requests, runner.req_to_token.table.shape[0])
        self.admission = PrefillAdmission(self.cm, self.policy, cfg.new_token_ratio, max_running,
                                          cfg.prefix_share_threshold)
        self.embedder = ImageEmbedder(runner, VisionEmbeddingCache(cfg.vision_cache_mb), metrics)
        self.constraints = constraints  # vlserve.constrained hooks, or None
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        metrics.kv_capacity.set(self.cm.capacity)

    # ---- requests in and out ------------------------------------------------------------------
    def add(self, req: Req) -> None:
        req.arrival_step = self.policy.now_step
        self.waiting.append(req)

    def abort(self, rid: str) -> None:
        """Thread-safe; takes effect at the start of the next step."""
        self._aborts.put(rid)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- the step -----------------------------------------------------------------------------
    def step(self) -> None:
        self._process_aborts()
        self.policy.step()
        plan = self._plan()
        if plan:
            try:
                self._run(plan)
            except Exception as e:  # a bug must fail the batch's requests, never the engine
                log.exception("forward failed")
                for p in plan:
                    if not p.req.finished:
                        self._finish(p.req, "error", error=f"internal error: {e}")
        self._update_gauges()

    def _plan(self) -> list[PlannedExtend]:
        plan, budget = [], self.cfg.chunked_prefill_size
        for req in list(self.running):
            if req not in self.running:  # retracted to make room for an earlier request
                continue
            n = 1 if req.pending_len == 1 else min(req.pending_len, budget)
            if n <= 0:
                continue
            slots = self._alloc_or_retract(req, n)
            if slots is not None:
                plan.append(PlannedExtend(req, n, slots))
                budget -= n if n > 1 else 0
        if self.waiting and budget > 0:
            plan += self.admission.admit(self.waiting, self.running, budget)
        return plan

    def _alloc_or_retract(self, req: Req, n: int) -> torch.Tensor | None:
        """Allocates; on OOM retracts the most recently admitted request (maybe req itself)."""
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
        req.num_retractions += 1
        req.input_logprobs.clear()  # recomputed from logprob_start_len on re-admission
        self.waiting.insert(0, req)

    def _run(self, plan: list[PlannedExtend]) -> None:
        embeds = self.embedder.prepare([(p.req, p.req.kv_len, p.req.kv_len + p.num_tokens)
                                        for p in plan if p.req.images])
        slices = [self._slice(p, embeds) for p in plan]
        batch = build_forward_batch(slices, self.runner.req_to_token.table, self.runner.vocab_size,
                                    self.runner.device)
        logits = self.runner.forward(batch)
        self.metrics.forward_passes.labels(mode=batch.mode.value).inc()

        last_rows = (torch.tensor([len(s.ids) - (s.logits_from % len(s.ids)) for s in slices]).cumsum(0) - 1).tolist()
        sample_rows, sample_reqs = [], []
        for p, s, last in zip(plan, slices, last_rows):
            req, was_prefill = p.req, p.req.pending_len > 1 or not p.req.output_ids
            if s.logits_from != -1:
                self._record_input_logprobs(req, s, logits[last + 1 - (len(s.ids) - s.logits_from):last + 1])
            req.kv_len += p.num_tokens
            if req.kv_len < req.seq_len:
                # A chunk of a longer prefill: share it now, so requests with the same long prefix
                # (questions on one video) admitted next step hit it instead of recomputing it.
                self.cm.cache_prefix(req)
                continue
            if was_prefill:
                self._on_prefill_done(req)
            if req.sampling.max_new_tokens == 0:
                self._finish(req, "length")
            elif self.constraints is not None and self.constraints.jump_before_first_token(req):
                self._emit(req, finished=False, replace_from=0)  # the forced prefix is extended next step
            else:
                sample_rows.append(last)
                sample_reqs.append(req)
        if sample_reqs:
            self._sample_and_emit(logits[sample_rows], sample_reqs)

    def _slice(self, p: PlannedExtend, embeds) -> ExtendSlice:
        req, start, end = p.req, p.req.kv_len, p.req.kv_len + p.num_tokens
        rows, emb = self.embedder.rows_and_embeds(req, start, end, embeds) if req.images else ([], None)
        logits_from = -1
        if req.return_logprob and req.logprob_start_len >= 0 and start < len(req.input_ids) - 1:
            first = max(req.logprob_start_len - 1, start)  # logits at q score the token at q + 1
            logits_from = first - start if first < end - 1 else -1
        return ExtendSlice(req.req_row, start, req.seq[start:end], p.slots, emb, rows, logits_from)

    @staticmethod
    def _record_input_logprobs(req: Req, s: ExtendSlice, logits: torch.Tensor) -> None:
        """Prompt logprobs (return_logprob with logprob_start_len): token q+1 under the logits at q."""
        positions = range(s.prefix_len + s.logits_from, s.prefix_len + len(s.ids))
        vocab = logits.shape[1]  # image positions hold pseudo-token ids: no logprob for them
        targets = [(i, q + 1) for i, q in enumerate(positions)
                   if q + 1 < len(req.input_ids) and req.input_ids[q + 1] < vocab]
        if not targets:
            return
        logprobs = torch.log_softmax(logits[[i for i, _ in targets]], dim=-1)
        ids = [req.input_ids[q] for _, q in targets]
        values = logprobs.gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist()
        req.input_logprobs.extend(zip(values, ids))

    def _on_prefill_done(self, req: Req) -> None:
        if req.first_token_time is None and not req.output_ids:
            self.metrics.prompt_tokens.inc(len(req.input_ids))
            self.metrics.cached_prompt_tokens.inc(max(0, req.cached_tokens))
        self.cm.cache_prefix(req)

    def _sample(self, logits: torch.Tensor, reqs: list[Req]) -> tuple[list[int], list[float]]:
        if self.constraints is not None and any(r.constraint is not None for r in reqs):
            self.constraints.mask(logits, reqs)
        ids, logprobs = sample(logits, [r.sampling for r in reqs], [r.generator for r in reqs])
        return ids.tolist(), logprobs.tolist()

    def _sample_each(self, logits: torch.Tensor, reqs: list[Req]) -> tuple[list[Req], list[int], list[float]]:
        """After the batched call failed: one request at a time, so only the faulty ones fail."""
        ok, ids, logprobs = [], [], []
        for i, req in enumerate(reqs):
            try:
                (tok,), (lp,) = self._sample(logits[i:i + 1], [req])
            except Exception as e:
                log.exception("sampling failed for request %s", req.rid)
                self._finish(req, "error", error=f"internal error while sampling: {e}")
                continue
            ok.append(req)
            ids.append(tok)
            logprobs.append(lp)
        return ok, ids, logprobs

    def _sample_and_emit(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        try:
            ids, logprobs = self._sample(logits, reqs)
        except Exception:
            reqs, ids, logprobs = self._sample_each(logits, reqs)
        now = time.monotonic()
        for req, tok, lp in zip(reqs, ids, logprobs):
            req.output_ids.append(tok)
            req.output_logprobs.append(lp)
            self.metrics.generation_tokens.inc()
            if req.first_token_time is None:
                req.first_token_time = now
                self.metrics.ttft.observe(now - req.arrival_time)
            try:
                replace_from = self.constraints.after_token(req, tok, self.cm) if self.constraints else None
            except Exception as e:  # one request's constraint must not fail the others in the batch
                log.exception("constraint update failed for request %s", req.rid)
                self._finish(req, "error", error=f"internal error in the output constraint: {e}")
                continue
            reason = self.finish_checker.check(req, self.runner.context_len)
            if reason:
                self._finish(req, reason, replace_from=replace_from)
            else:
                self._emit(req, finished=False, replace_from=replace_from)

    # ---- ending requests ----------------------------------------------------------------------
    def _finish(self, req: Req, reason: str, error: str | None = None, replace_from: int | None = None) -> None:
        req.finish_reason = reason
        self.cm.release(req)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.metrics.requests.labels(status="error" if error else ("abort" if reason == "abort" else "ok")).inc()
        self.metrics.e2e.observe(time.monotonic() - req.arrival_time)
        self._emit(req, finished=True, error=error, replace_from=replace_from)

    def _emit(self, req: Req, finished: bool, error: str | None = None, replace_from: int | None = None) -> None:
        if req.sink is None:
            return
        if replace_from is not None:
            new_ids, new_lps = req.output_ids[replace_from:], req.output_logprobs[replace_from:]
        else:
            new_ids, new_lps = req.output_ids[-1:], req.output_logprobs[-1:]
        if finished and req.finish_reason in ("abort", "error") or (finished and not req.output_ids):
            new_ids, new_lps = [], []
        meta = {"prompt_tokens": len(req.input_ids), "completion_tokens": len(req.output_ids),
                "cached_tokens": max(0, req.cached_tokens), "finish_reason": req.finish_reason}
        if finished and req.return_logprob and req.logprob_start_len >= 0:
            meta["input_token_logprobs"] = req.input_logprobs
        req.sink(StepOutput(req.rid, new_ids, new_lps, finished, req.finish_reason, error, meta, replace_from))

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
