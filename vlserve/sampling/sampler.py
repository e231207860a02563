"""Batched sampling: one call per forward for every request that produces a token."""

import torch

from vlserve.core.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [B, V] float32 (already masked by constraints). Returns (token ids [B], logprobs [B]).

    Logprobs are of the chosen token under the unmodified distribution (as SGLang reports them).
    """
    logprobs_all = torch.log_softmax(logits, dim=-1)
    greedy = torch.tensor([p.greedy for p in params])
    next_ids = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        rows = (~greedy).nonzero().flatten().tolist()
        probs = _filtered_probs(logits[rows], [params[r] for r in rows])
        for j, r in enumerate(rows):
            next_ids[r] = torch.multinomial(probs[j], 1, generator=generators[r]).item()
    return next_ids, logprobs_all.gather(1, next_ids[:, None]).squeeze(1)


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype)[:, None]
    probs = torch.softmax(logits / temps, dim=-1)
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
