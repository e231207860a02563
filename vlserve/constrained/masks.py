"""Batched vocabulary masking for the sampler."""

from __future__ import annotations

import torch


def apply_constraint_masks(logits: torch.Tensor, states: list) -> None:
    """Set disallowed logits to -inf in place, for the rows whose state is not None.

    logits: [batch, vocab] (any device). One bool mask is built per call on the CPU from the
    cached per-state rows (a row copy each, no loop over the vocabulary) and moved once."""
    rows = [i for i, s in enumerate(states) if s is not None]
    if not rows:
        return
    if len(states) != logits.shape[0]:
        raise ValueError(f"{len(states)} states for {logits.shape[0]} logit rows")
    allowed = torch.empty((len(rows), logits.shape[1]), dtype=torch.bool)
    for j, i in enumerate(rows):
        states[i].fill_allowed_mask(allowed[j])
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    disallowed = ~allowed.to(logits.device, non_blocking=True)
    logits[index] = logits[index].masked_fill(disallowed, float("-inf"))
