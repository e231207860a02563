"""One batched forward over ragged requests: the tensors the model and attention read."""

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "prefill"  # new prompt tokens (after a cached prefix) — also chunked prefill and jump-forward
    DECODE = "decode"  # one new token per request


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64; real vocab ids (image positions hold any valid id, replaced by embeds)
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64: the slot each new token's KV is written to
    req_pool_indices: torch.Tensor  # [B] int64: rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64: tokens in the pool for each request after this forward
    extend_lens: torch.Tensor  # [B] int64: new tokens per request (1 in decode)
    qo_start_loc: torch.Tensor  # [B] int64: first row of each request in the T new tokens
    req_to_token: torch.Tensor  # the whole table, [max_requests, max_context_len] int32
    logits_rows: torch.Tensor  # [L] int64: rows of T whose next-token logits are wanted
    image_mask: torch.Tensor | None = None  # [T] bool: rows that take image embeddings, in order
    image_embeds: torch.Tensor | None = None  # [mask.sum(), hidden]

    @property
    def batch_size(self) -> int:
        return self.req_pool_indices.shape[0]
