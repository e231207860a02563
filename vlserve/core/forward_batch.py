"""One batched forward over ragged requests: the tensors the model and attention read, and which
rows of the model's output are whose logits.

The logits-row layout (an invariant the runner relies on when it reads logits back): the model
returns one logits row per entry of `logits_rows`, in batch order; slice i owns the
`LogitsLayout.counts[i]` consecutive output rows starting at `LogitsLayout.first[i]`, the last of
which predicts the token after the slice. Only this module computes it.
"""

import enum
from itertools import accumulate
from dataclasses import dataclass, field

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # new prompt tokens after a cached prefix; also chunked prefill and jump-forward
    DECODE = "decode"  # one new token per request


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
    mrope_positions: torch.Tensor | None = None  # [3, len(ids)] for M-RoPE models (Req.mrope); None: indices

    @property
    def num_logits(self) -> int:
        return len(self.ids) - (self.logits_from % len(self.ids))


@dataclass(frozen=True)
class LogitsLayout:
    first: list[int]  # output row of each slice's first logits row
    counts: list[int]  # logits rows of each slice

    @classmethod
    def of(cls, slices: list[ExtendSlice]) -> "LogitsLayout":
        counts = [s.num_logits for s in slices]
        return cls(list(accumulate(counts[:-1], initial=0)), counts)

    def rows(self, i: int) -> slice:
        return slice(self.first[i], self.first[i] + self.counts[i])

    def last(self, i: int) -> int:
        """The output row predicting the token after slice i."""
        return self.first[i] + self.counts[i] - 1


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64; real vocab ids (image positions hold any valid id, replaced by embeds)
    positions: torch.Tensor  # [T] int64, or [3, T] (temporal, height, width) for M-RoPE models
    out_cache_loc: torch.Tensor  # [T] int64: the slot each new token's KV is written to
    req_pool_indices: torch.Tensor  # [B] int64: rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64: tokens in the pool for each request after this forward
    extend_lens: torch.Tensor  # [B] int64: new tokens per request (1 in decode)
    qo_start_loc: torch.Tensor  # [B] int64: first row of each request in the T new tokens
    req_to_token: torch.Tensor  # the whole table, [max_requests, max_context_len] int32
    logits_rows: torch.Tensor  # [L] int64: rows of T whose next-token logits are wanted
    image_mask: torch.Tensor | None = None  # [T] bool: rows that take image embeddings, in order
    image_embeds: torch.Tensor | None = None  # [mask.sum(), hidden]
    layout: LogitsLayout | None = None  # which output rows belong to which slice

    @property
    def batch_size(self) -> int:
        return self.req_pool_indices.shape[0]


def build_forward_batch(slices: list[ExtendSlice], req_to_token: torch.Tensor, vocab_size: int,
                        device: str | torch.device = "cpu") -> ForwardBatch:
    # The index lists are built in Python and each becomes a tensor in one call: per-slice aranges,
    # cats and elementwise ops cost a few us each, 30 us a decode step at batch 1 and 130 at batch 32.
    lens = [len(s.ids) for s in slices]
    starts = list(accumulate(lens[:-1], initial=0))
    # pseudo-token ids (image positions) never reach the embedding
    ids = torch.tensor([i if 0 <= i < vocab_size else 0 for s in slices for i in s.ids], dtype=torch.int64)
    image_mask = None
    embeds = [s.image_embeds for s in slices if s.image_rows]
    if embeds:
        image_mask = torch.zeros(len(ids), dtype=torch.bool)
        for s, start in zip(slices, starts):
            image_mask[[start + r for r in s.image_rows]] = True
    positions = _positions(slices, lens)
    layout = LogitsLayout.of(slices)
    logits_rows = [r for start, n, k in zip(starts, lens, layout.counts) for r in range(start + n - k, start + n)]
    return ForwardBatch(
        mode=ForwardMode.DECODE if all(n == 1 for n in lens) else ForwardMode.EXTEND,
        input_ids=ids.to(device), positions=positions.to(device),
        out_cache_loc=(slices[0].slots if len(slices) == 1 else torch.cat([s.slots for s in slices])).to(device),
        req_pool_indices=torch.tensor([s.req_row for s in slices], dtype=torch.int64, device=device),
        seq_lens=torch.tensor([s.prefix_len + n for s, n in zip(slices, lens)], dtype=torch.int64, device=device),
        extend_lens=torch.tensor(lens, dtype=torch.int64, device=device),
        qo_start_loc=torch.tensor(starts, dtype=torch.int64, device=device), req_to_token=req_to_token,
        logits_rows=torch.tensor(logits_rows, dtype=torch.int64, device=device),
        image_mask=None if image_mask is None else image_mask.to(device),
        image_embeds=None if not embeds else torch.cat(embeds).to(device), layout=layout)


def _positions(slices: list[ExtendSlice], lens: list[int]) -> torch.Tensor:
    """Token indices [T]; [3, T] as soon as one slice carries M-RoPE positions (the others' indices
    repeated on the three axes, which is what M-RoPE gives a text-only request)."""
    if all(s.mrope_positions is None for s in slices):
        return torch.tensor([p for s, n in zip(slices, lens) for p in range(s.prefix_len, s.prefix_len + n)],
                            dtype=torch.int64)
    indices = [torch.arange(s.prefix_len, s.prefix_len + n) for s, n in zip(slices, lens)]
    return torch.cat([i.expand(3, -1) if s.mrope_positions is None else s.mrope_positions
                      for s, i in zip(slices, indices)], dim=1)
