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
        items = prompt_logprob_items(req)
        meta["input_token_logprobs"] = [(lp, tid) for lp, tid, _ in items]
        if req.top_logprobs_num > 0:
            meta["input_top_logprobs"] = [top if lp is not None else None for lp, _, top in items]
    return StepOutput(req.rid, new_ids, new_lps, finished, req.finish_reason, error, meta, replace_from, new_tops,
                      error_status)


def prompt_logprob_items(req: Req) -> list[tuple[float | None, int, list]]:
    """(logprob, id, alternatives) of every prompt position from logprob_start_len on, as SGLang lists
    them: position 0 and image positions (pseudo tokens) have no logprob (None, id, []); the others are
    the scored tokens, in order."""
    scored = iter(req.input_logprobs)
    pending = next(scored, None)
    items = []
    for position in range(max(req.logprob_start_len, 0), len(req.input_ids)):
        token = req.input_ids[position]
        if position > 0 and pending is not None and pending[1] == token:
            items.append(pending)
            pending = next(scored, None)
        else:
            items.append((None, token, []))
    return items
