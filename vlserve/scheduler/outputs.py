"""What a request's waiter receives after a step: its new tokens (or a rewritten tail) and meta."""

import time

from vlserve.core.request import Req, StepOutput


def step_output(req: Req, finished: bool, error: str | None = None, replace_from: int | None = None,
                error_status: int = 500) -> StepOutput:
    start = replace_from if replace_from is not None else len(req.output_ids) - 1  # jump-forward rewrote from there
    new_ids, new_lps, new_tops = req.output_ids[start:], req.output_logprobs[start:], req.output_top_logprobs[start:]
    if finished and req.finish_reason in ("abort", "error") or (finished and not req.output_ids):
        new_ids, new_lps, new_tops = [], [], []
    meta = {"id": req.rid, "prompt_tokens": len(req.input_ids), "completion_tokens": len(req.output_ids),
            "cached_tokens": max(0, req.cached_tokens), "finish_reason": req.finish_reason}
    if finished:
        meta["e2e_latency"] = time.monotonic() - req.arrival_time
        if req.finish_reason == "stop":
            meta["matched_stop"] = req.finish_matched
    if finished and req.return_logprob and req.logprob_start_len >= 0:
        meta["input_token_logprobs"] = req.input_logprobs
    return StepOutput(req.rid, new_ids, new_lps, finished, req.finish_reason, error, meta, replace_from, new_tops,
                      error_status)
