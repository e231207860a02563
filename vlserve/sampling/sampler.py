"""Batched sampling: one call per forward for every request that produces a token.

Any finite parameter value the validation lets through is computable here: a temperature past
float32's range is held at its largest finite value (near-uniform over the allowed tokens, never
-inf / inf = NaN on a masked token), and logits a penalty pushed to +inf are held finite. A row with
no token left to sample (the constraint, min_new_tokens and logit_bias exclude them all) raises
InvalidRequest: the request's own values caused it, and only that request fails (runner/sample_step.py).
"""

import torch

from vlserve.core.errors import InvalidRequest
from vlserve.core.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [B, V] float32 (already masked by constraints). Returns (token ids [B], logprobs [B]).

    Logprobs are of the chosen token under the unmodified distribution (as SGLang reports them).
    """
    logits = finite_above(logits)
    check_sampleable(logits)
    logprobs_all = torch.log_softmax(logits, dim=-1)
    greedy = torch.tensor([p.greedy for p in params])
    next_ids = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        rows = (~greedy).nonzero().flatten().tolist()
        probs = _filtered_probs(logits[rows], [params[r] for r in rows])
        for j, r in enumerate(rows):
            next_ids[r] = torch.multinomial(probs[j], 1, generator=generators[r]).item()
    return next_ids, logprobs_all.gather(1, next_ids[:, None]).squeeze(1)


def finite_above(logits: torch.Tensor) -> torch.Tensor:
    """+inf held at the dtype's largest value (a tiny repetition_penalty divides a logit past the
    range); -inf (a masked token) and NaN (a model fault) stay as they are."""
    return logits.clamp(max=torch.finfo(logits.dtype).max)


def check_sampleable(logits: torch.Tensor) -> None:
    """RuntimeError for NaN logits (the model's fault); InvalidRequest for a row whose every token is
    masked (the request's constraint, min_new_tokens or logit_bias leave nothing to sample)."""
    if bool(torch.isnan(logits).any()):
        raise RuntimeError("the model produced NaN logits")
    dead = torch.isneginf(logits).all(dim=-1)
    if bool(dead.any()):
        raise InvalidRequest("no token can be sampled: the output constraint, min_new_tokens (which bans EOS and "
                             "stop_token_ids) and logit_bias together exclude every token")


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    biggest = torch.finfo(logits.dtype).max
    temps = torch.tensor([min(p.temperature, biggest) for p in params], dtype=logits.dtype)[:, None]
    probs = torch.softmax(finite_above(logits / temps), dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[1])[None, :]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else probs.shape[1] for p in params])[:, None]
    top_p = torch.tensor([p.top_p for p in params], dtype=probs.dtype)[:, None]
    min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype)[:, None]
    cumulative = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass before each token
    drop = (ranks >= top_k) | (cumulative > top_p) | (sorted_probs < min_p * sorted_probs[:, :1])
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    filtered = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)
