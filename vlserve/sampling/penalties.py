"""Logit processing before sampling: presence, frequency and repetition penalties, and min_new_tokens.

Batched: one [rows, vocab] count matrix for the rows that ask for a penalty, built with one
scatter_add from the requests' token ids. Definitions as vLLM and SGLang use them:
presence  logits -= presence_penalty  * (count > 0)          over the output
frequency logits -= frequency_penalty * count                over the output
repetition logit > 0 → logit / p, else logit * p              over prompt and output
"""

import torch

from vlserve.core.sampling_params import SamplingParams


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]],
                    outputs: list[list[int]]) -> None:
    """In place on logits [B, V]; prompts/outputs are each row's token ids (ids >= V are ignored)."""
    rows = [i for i, p in enumerate(params) if p.penalised]
    if not rows:
        return
    vocab = logits.shape[1]
    out_counts = _counts([outputs[i] for i in rows], vocab, logits.device)
    sub = logits[rows]
    presence = _column([params[i].presence_penalty for i in rows], sub)
    frequency = _column([params[i].frequency_penalty for i in rows], sub)
    sub -= presence * (out_counts > 0) + frequency * out_counts
    repetition = _column([params[i].repetition_penalty for i in rows], sub)
    seen = (out_counts > 0) | (_counts([prompts[i] for i in rows], vocab, logits.device) > 0)
    sub = torch.where(seen, torch.where(sub > 0, sub / repetition, sub * repetition), sub)
    logits[rows] = sub


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    """Adds each request's logit_bias (ids past the vocabulary are ignored)."""
    vocab = logits.shape[1]
    for i, p in enumerate(params):
        for token, bias in p.logit_bias.items():
            if token < vocab:
                logits[i, token] += bias


def mask_early_stops(logits: torch.Tensor, params: list[SamplingParams], outputs: list[list[int]],
                     eos_token_ids: tuple[int, ...]) -> None:
    """Rows still short of min_new_tokens cannot pick EOS (unless ignore_eos) or a stop token id."""
    vocab = logits.shape[1]
    for i, p in enumerate(params):
        if len(outputs[i]) < p.min_new_tokens:
            banned = [t for t in (*(() if p.ignore_eos else eos_token_ids), *p.stop_token_ids) if 0 <= t < vocab]
            if banned:
                logits[i, banned] = float("-inf")


def _counts(seqs: list[list[int]], vocab: int, device) -> torch.Tensor:
    counts = torch.zeros(len(seqs), vocab, device=device)
    flat = [(r, t) for r, seq in enumerate(seqs) for t in seq if 0 <= t < vocab]
    if flat:
        index = torch.tensor(flat, device=device)
        counts.index_put_((index[:, 0], index[:, 1]), torch.ones(len(flat), device=device), accumulate=True)
    return counts


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]
