"""Sampling one step's requests: constraint masks, one batched call, and a per-request fallback so
that one request's failure (a bad constraint state, a sampler bug) fails only that request."""

import logging

import torch

from vlserve.constrained import apply_constraint_masks
from vlserve.core.request import Req
from vlserve.core.step import SampledToken
from vlserve.sampling.sampler import sample

log = logging.getLogger(__name__)


def sample_requests(logits: torch.Tensor, reqs: list[Req]) -> tuple[list[SampledToken | None], list[str | None]]:
    """logits: [len(reqs), V], one row per request. Returns (tokens, errors), one of each per request."""
    try:
        return _sample(logits, reqs), [None] * len(reqs)
    except Exception:
        return _sample_each(logits, reqs)


def _sample(logits: torch.Tensor, reqs: list[Req]) -> list[SampledToken]:
    if any(r.constraint is not None for r in reqs):
        apply_constraint_masks(logits, [r.constraint for r in reqs])
    ids, logprobs = sample(logits, [r.sampling for r in reqs], [r.generator for r in reqs])
    return [SampledToken(t, lp) for t, lp in zip(ids.tolist(), logprobs.tolist())]


def _sample_each(logits: torch.Tensor, reqs: list[Req]) -> tuple[list[SampledToken | None], list[str | None]]:
    tokens, errors = [], []
    for i, req in enumerate(reqs):
        try:
            tokens.append(_sample(logits[i:i + 1], [req])[0])
            errors.append(None)
        except Exception as e:
            log.exception("sampling failed for request %s", req.rid)
            tokens.append(None)
            errors.append(f"internal error while sampling: {e}")
    return tokens, errors
