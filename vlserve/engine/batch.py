"""Builds one ForwardBatch from per-request slices of new tokens."""

from dataclasses import dataclass, field

import torch

from vlserve.model.forward_batch import ForwardBatch, ForwardMode


@dataclass
class ExtendSlice:
    """New tokens of one request in this forward: positions prefix_len .. prefix_len+len(ids)-1."""
    req_row: int
    prefix_len: int
    ids: list[int]  # may hold pseudo-token ids (image positions); never looked up in the embedding
    slots: torch.Tensor  # [len(ids)] int64, already written to req_to_token
    image_embeds: torch.Tensor | None = None  # [n, hidden] for the rows in image_rows, in order
    image_rows: list[int] = field(default_factory=list)  # indices into ids that are image positions
    logits_from: int = -1  # want logits for ids[logits_from:] (default: the last token only)


def build_forward_batch(slices: list[ExtendSlice], req_to_token: torch.Tensor, vocab_size: int,
                        device: str | torch.device = "cpu") -> ForwardBatch:
    decode = all(len(s.ids) == 1 for s in slices)
    lens = [len(s.ids) for s in slices]
    starts = torch.tensor([0] + lens[:-1], dtype=torch.int64).cumsum(0)
    ids = torch.tensor([i for s in slices for i in s.ids], dtype=torch.int64)
    image_mask = None
    embeds = [s.image_embeds for s in slices if s.image_rows]
    if embeds:
        image_mask = torch.zeros(len(ids), dtype=torch.bool)
        for s, start in zip(slices, starts.tolist()):
            image_mask[[start + r for r in s.image_rows]] = True
    ids = torch.where((ids >= vocab_size) | (ids < 0), 0, ids)  # pseudo-token ids never reach the embedding
    positions = torch.cat([torch.arange(s.prefix_len, s.prefix_len + n) for s, n in zip(slices, lens)])
    logits_rows = torch.cat([
        torch.arange(start + (s.logits_from % n), start + n) for s, start, n in zip(slices, starts.tolist(), lens)])
    return ForwardBatch(
        mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        input_ids=ids.to(device), positions=positions.to(device),
        out_cache_loc=torch.cat([s.slots for s in slices]).to(device),
        req_pool_indices=torch.tensor([s.req_row for s in slices], dtype=torch.int64, device=device),
        seq_lens=torch.tensor([s.prefix_len + n for s, n in zip(slices, lens)], dtype=torch.int64, device=device),
        extend_lens=torch.tensor(lens, dtype=torch.int64, device=device),
        qo_start_loc=starts.to(device), req_to_token=req_to_token, logits_rows=logits_rows.to(device),
        image_mask=None if image_mask is None else image_mask.to(device),
        image_embeds=None if not embeds else torch.cat(embeds).to(device))
