"""Per-request timings into the metrics (and the request log with --log-requests).

queue time = arrival → first admission; prefill time = first admission → first token; decode time =
first token → end; inter-token latency = between two output steps of a request (a jump-forward step
counts once); time per output token = decode time / (output tokens - 1).
"""

import logging

from vlserve.core.request import Req
from vlserve.metrics import Metrics

log = logging.getLogger("vlserve.requests")


class RequestStats:
    def __init__(self, metrics: Metrics, log_requests: bool = False):
        self.metrics, self.log_requests = metrics, log_requests

    def admitted(self, req: Req, now: float) -> None:
        if req.admit_time is not None:
            return  # re-admitted after a retraction
        req.admit_time = now
        self.metrics.queue_time.observe(now - req.arrival_time)
        if self.log_requests:
            log.info("request %s admitted: %d prompt tokens, %d cached, queued %.3f s", req.rid, len(req.input_ids),
                     max(0, req.cached_tokens), now - req.arrival_time)

    def token(self, req: Req, now: float) -> None:
        self.metrics.generation_tokens.inc()
        if req.first_token_time is None:
            req.first_token_time = now
            self.metrics.ttft.observe(now - req.arrival_time)
            if req.admit_time is not None:
                self.metrics.prefill_time.observe(now - req.admit_time)
        elif req.last_token_time is not None and now > req.last_token_time:
            self.metrics.itl.observe(now - req.last_token_time)
        req.last_token_time = now

    def finished(self, req: Req, now: float, error: str | None) -> None:
        status = "error" if error else ("abort" if req.finish_reason == "abort" else "ok")
        self.metrics.requests.labels(status=status).inc()
        self.metrics.finished.labels(finished_reason=req.finish_reason).inc()
        self.metrics.e2e.observe(now - req.arrival_time)
        self.metrics.request_prompt_tokens.observe(len(req.input_ids))
        self.metrics.request_generation_tokens.observe(len(req.output_ids))
        if req.first_token_time is not None:
            self.metrics.decode_time.observe(now - req.first_token_time)
            if len(req.output_ids) > 1:
                self.metrics.tpot.observe((now - req.first_token_time) / (len(req.output_ids) - 1))
        if self.log_requests:
            log.info("request %s finished (%s%s): %d prompt tokens, %d cached, %d generated, %.3f s", req.rid,
                     req.finish_reason, f": {error}" if error else "", len(req.input_ids), max(0, req.cached_tokens),
                     len(req.output_ids), now - req.arrival_time)
