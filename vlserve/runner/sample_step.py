"""Sampling one step's requests: constraint masks, one batched call, and a per-request fallback so
that one request's failure fails only that request: with a 400 when its own values caused it (the
sampler raises InvalidRequest, e.g. nothing left to sample), else a 500 (a bad constraint state, a
sampler bug). Either way it ends as an error of that request, never of the step."""

import logging

import torch

from vlserve.constrained import apply_constraint_masks
from vlserve.core.errors import InvalidRequest
from vlserve.core.request import Req
from vlserve.core.step import SampledToken, SampleFailure
from vlserve.sampling.penalties import apply_logit_bias, apply_penalties, mask_early_stops
from vlserve.sampling.sampler import sample

log = logging.getLogger(__name__)


def sample_requests(logits: torch.Tensor, reqs: list[Req], eos_token_ids: tuple[int, ...] = (), sampler=sample
                    ) -> tuple[list[SampledToken | None], list[SampleFailure | None]]:
    """logits: [len(reqs), V], one row per request. Returns (tokens, errors), one of each per request.
    sampler: (logits, params, generators) -> (ids, logprobs), after the masks (sampling/sampler.py's)."""
    try:
        # penalties and logit bias are not idempotent: the per-request fallback needs the logits as
        # they came, so copy them then (constraint and min_new_tokens masks may safely apply twice)
        rewrites = any(r.sampling.penalised or r.sampling.logit_bias for r in reqs)
        return _sample(logits.clone() if rewrites else logits, reqs, eos_token_ids, sampler), [None] * len(reqs)
    except Exception:
        return _sample_each(logits, reqs, eos_token_ids, sampler)


def _sample(logits: torch.Tensor, reqs: list[Req], eos_token_ids: tuple[int, ...], sampler=sample
            ) -> list[SampledToken]:
    """Penalties, logit bias → min_new_tokens → constraint masks → sample; logits are changed in place."""
    params = [r.sampling for r in reqs]
    apply_penalties(logits, params, [r.input_ids for r in reqs], [r.output_ids for r in reqs])
    apply_logit_bias(logits, params)
    mask_early_stops(logits, params, [r.output_ids for r in reqs], eos_token_ids)
    if any(r.constraint is not None for r in reqs):
        apply_constraint_masks(logits, [r.constraint for r in reqs])
    ids, logprobs = sampler(logits, params, [r.generator for r in reqs])
    tops = _top_logprobs(logits, [r.top_logprobs_num if r.return_logprob else 0 for r in reqs])
    return [SampledToken(t, lp, top) for t, lp, top in zip(ids.tolist(), logprobs.tolist(), tops)]


def _top_logprobs(logits: torch.Tensor, nums: list[int]) -> list[list[tuple[float, int]]]:
    out = [[] for _ in nums]
    rows = [i for i, k in enumerate(nums) if k > 0]
    if rows:
        k = max(nums[i] for i in rows)
        values, ids = torch.log_softmax(logits[rows], dim=-1).topk(min(k, logits.shape[1]), dim=-1)
        for j, i in enumerate(rows):
            # a masked token (-inf) is no alternative: it could not have been sampled
            out[i] = [(v, t) for v, t in zip(values[j, :nums[i]].tolist(), ids[j, :nums[i]].tolist())
                      if v != float("-inf")]
    return out


def _sample_each(logits: torch.Tensor, reqs: list[Req], eos_token_ids: tuple[int, ...], sampler=sample
                 ) -> tuple[list[SampledToken | None], list[SampleFailure | None]]:
    tokens, errors = [], []
    for i, req in enumerate(reqs):
        try:
            tokens.append(_sample(logits[i:i + 1].clone(), [req], eos_token_ids, sampler)[0])
            errors.append(None)
        except InvalidRequest as e:
            tokens.append(None)
            errors.append(SampleFailure(f"{e}", status=400))
        except Exception as e:
            log.exception("sampling failed for request %s", req.rid)
            tokens.append(None)
            errors.append(SampleFailure(f"internal error while sampling: {e}"))
    return tokens, errors
