"""What a request's waiter receives after a step: its new tokens (or a rewritten tail) and meta."""

from vlserve.core.request import Req, StepOutput


def step_output(req: Req, finished: bool, error: str | None = None, replace_from: int | None = None) -> StepOutput:
    if replace_from is not None:  # jump-forward rewrote the output from here on
        new_ids, new_lps = req.output_ids[replace_from:], req.output_logprobs[replace_from:]
    else:
        new_ids, new_lps = req.output_ids[-1:], req.output_logprobs[-1:]
    if finished and req.finish_reason in ("abort", "error") or (finished and not req.output_ids):
        new_ids, new_lps = [], []
    meta = {"prompt_tokens": len(req.input_ids), "completion_tokens": len(req.output_ids),
            "cached_tokens": max(0, req.cached_tokens), "finish_reason": req.finish_reason}
    if finished and req.return_logprob and req.logprob_start_len >= 0:
        meta["input_token_logprobs"] = req.input_logprobs
    return StepOutput(req.rid, new_ids, new_lps, finished, req.finish_reason, error, meta, replace_from)
