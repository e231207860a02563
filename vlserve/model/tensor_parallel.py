"""Megatron-style tensor parallelism of the decoder, by module substitution after loading.

`shard_model(model, tp)` replaces, in place, the decoder's modules with parallel ones that hold
this rank's part of each weight (cut from the full, loaded weight):

- `embed_tokens` → VocabParallelEmbedding: rows of the vocabulary; ids outside this rank's range
  (pseudo-token ids of image positions, which are >= vocab, are outside every rank's) look up
  nothing and give zeros; the ranks' parts are summed (all-reduce). LLaVA then writes the image
  features into the image rows after that sum.
- q/k/v (fused) and gate/up (fused) → ColumnParallelLinear: this rank's attention heads (its KV
  heads; when there are fewer KV heads than ranks, the one KV head its query heads read, held by
  several ranks) and its columns of the MLP. Each fused section is cut separately, bias included.
- o and down → RowParallelLinear: the matching input columns; partial outputs all-reduced, the
  bias (if any) added once, after the sum.
- `lm_head` → ParallelLMHead: rows of the vocabulary, gathered to rank 0 (other ranks get an
  empty tensor: only rank 0 samples).

The vision tower, the projector and the norms stay whole on every rank and run no collective
(a collective inside the tower would hang when only some ranks have images this step).
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from vlserve.core.errors import CheckpointError
from vlserve.cpu.gemm import CpuLinear
from vlserve.model.quantized_linear import QuantizedLinear


@dataclass(frozen=True)
class TPContext:
    """This process's place in the tensor-parallel group."""
    rank: int
    size: int
    group: Any = None  # a torch.distributed ProcessGroup (None: the default group)


def check_shardable(num_heads: int, num_kv_heads: int, intermediate_size: int, tp_size: int) -> None:
    """Raises ValueError naming what does not divide."""
    if num_heads % tp_size:
        raise ValueError(f"--tp-size {tp_size} must divide the {num_heads} attention heads")
    if intermediate_size % tp_size:
        raise ValueError(f"--tp-size {tp_size} must divide the MLP size {intermediate_size}")
    if num_kv_heads % tp_size and tp_size % num_kv_heads:
        raise ValueError(f"--tp-size {tp_size} and the {num_kv_heads} KV heads: one must divide the other")


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank holds in its KV pool: a share, or one (replicated) when there are fewer than ranks."""
    return max(1, num_kv_heads // tp_size)


def kv_head_range(num_kv_heads: int, tp: TPContext) -> range:
    if num_kv_heads >= tp.size:
        per = num_kv_heads // tp.size
        return range(tp.rank * per, (tp.rank + 1) * per)
    head = tp.rank // (tp.size // num_kv_heads)  # ranks sharing a KV head hold the same one
    return range(head, head + 1)


def vocab_range(vocab_size: int, tp: TPContext) -> range:
    """This rank's rows of the vocabulary: equal shares of ceil(vocab / size); the last may be short."""
    per = -(-vocab_size // tp.size)
    return range(min(tp.rank * per, vocab_size), min((tp.rank + 1) * per, vocab_size))


def _local_linear(like: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A linear of like's class (CpuLinear keeps its GEMM path) holding the given weight."""
    local = type(like)(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    local.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    if bias is not None:
        local.bias = nn.Parameter(bias.contiguous(), requires_grad=False)
    if isinstance(local, CpuLinear):
        local.pack()  # its one resident layout, now rather than at the first forward
    return local


class ColumnParallelLinear(nn.Module):
    """Output features cut by rows of the weight; no communication (the output stays this rank's)."""

    def __init__(self, full: nn.Linear, rows: list[range]):
        super().__init__()
        index = torch.tensor([r for part in rows for r in part], dtype=torch.long, device=full.weight.device)
        bias = None if full.bias is None else full.bias.detach()[index]
        self.local = _local_linear(full, full.weight.detach()[index], bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(x)


class RowParallelLinear(nn.Module):
    """Input features cut by columns of the weight; partial outputs summed over the group, then the bias."""

    def __init__(self, full: nn.Linear, cols: range, tp: TPContext):
        super().__init__()
        self.local = _local_linear(full, full.weight.detach()[:, cols.start:cols.stop], None)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone(), requires_grad=False)
        self.group = tp.group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        dist.all_reduce(y, group=self.group)
        return y if self.bias is None else y + self.bias  # once, after the sum


class VocabParallelEmbedding(nn.Module):
    def __init__(self, full: nn.Embedding, tp: TPContext):
        super().__init__()
        self.rows = vocab_range(full.num_embeddings, tp)
        self.weight = nn.Parameter(full.weight.detach()[self.rows.start:self.rows.stop].clone(), requires_grad=False)
        self.group = tp.group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # masked before the lookup: other ranks' ids and pseudo-token ids (>= vocab) read row 0 and are zeroed
        mine = (ids >= self.rows.start) & (ids < self.rows.stop)
        local = torch.where(mine, ids - self.rows.start, 0)
        out = nn.functional.embedding(local, self.weight) * mine[:, None].to(self.weight.dtype)
        dist.all_reduce(out, group=self.group)
        return out


class ParallelLMHead(nn.Module):
    """Logits of this rank's vocabulary rows, gathered to rank 0 as [N, vocab]; other ranks return [0]."""

    def __init__(self, full: nn.Linear, tp: TPContext, tied: VocabParallelEmbedding | None = None):
        super().__init__()
        self.vocab_size, self.tp = full.out_features, tp
        self.per_rank = -(-self.vocab_size // tp.size)
        rows = vocab_range(self.vocab_size, tp)
        weight = tied.weight if tied is not None else full.weight.detach()[rows.start:rows.stop].clone()
        self.local = _local_linear(full, weight, None)
        if tied is not None:
            self.local.weight = tied.weight  # one parameter, as in the unsharded model

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        part = self.local(hidden)
        if part.shape[1] < self.per_rank:  # gather needs equal parts: pad the short last share
            part = nn.functional.pad(part, (0, self.per_rank - part.shape[1]))
        part = part.contiguous()
        if self.tp.rank != 0:
            dist.gather(part, None, dst=_global_rank(self.tp, 0), group=self.tp.group)
            return hidden.new_empty(0)
        parts = [torch.empty_like(part) for _ in range(self.tp.size)]
        dist.gather(part, parts, dst=_global_rank(self.tp, 0), group=self.tp.group)
        return torch.cat(parts, dim=1)[:, :self.vocab_size]


def _global_rank(tp: TPContext, group_rank: int) -> int:
    return group_rank if tp.group is None else dist.get_global_rank(tp.group, group_rank)


def shard_attention(attn: nn.Module, tp: TPContext) -> None:
    """attn: vlserve.model.llama.Attention with fused qkv_proj; keeps this rank's heads."""
    d, heads, kv_heads = attn.head_dim, attn.num_heads, attn.num_kv_heads
    q_per = heads // tp.size
    kv = kv_head_range(kv_heads, tp)
    q_rows = range(tp.rank * q_per * d, (tp.rank + 1) * q_per * d)
    k_rows = range(heads * d + kv.start * d, heads * d + kv.stop * d)
    v_rows = range((heads + kv_heads) * d + kv.start * d, (heads + kv_heads) * d + kv.stop * d)
    attn.qkv_proj = ColumnParallelLinear(attn.qkv_proj, [q_rows, k_rows, v_rows])
    attn.o_proj = RowParallelLinear(attn.o_proj, q_rows, tp)
    attn.num_heads, attn.num_kv_heads = q_per, len(kv)


def shard_mlp(mlp: nn.Module, tp: TPContext) -> None:
    """mlp: vlserve.model.llama.MLP with fused gate_up_proj; keeps this rank's intermediate columns."""
    inter = mlp.gate_up_proj.out_features // 2
    per = inter // tp.size
    cols = range(tp.rank * per, (tp.rank + 1) * per)
    mlp.gate_up_proj = ColumnParallelLinear(mlp.gate_up_proj, [cols, range(inter + cols.start, inter + cols.stop)])
    mlp.down_proj = RowParallelLinear(mlp.down_proj, cols, tp)


def shard_model(model: nn.Module, tp: TPContext) -> nn.Module:
    """Shards a loaded LlavaForServing (projections fused) in place for rank tp.rank; returns it."""
    lm = model.language_model
    if any(isinstance(m, QuantizedLinear) for m in lm.modules()):
        raise CheckpointError("--tp-size > 1 does not shard quantized (compressed-tensors) layers; serve this "
                              "checkpoint with --tp-size 1")
    check_shardable(lm.layers[0].self_attn.num_heads, lm.layers[0].self_attn.num_kv_heads,
                    lm.layers[0].mlp.gate_up_proj.out_features // 2, tp.size)
    tied = (getattr(lm.embed_tokens, "head", None) is model.lm_head  # cpu/tied_embedding.py: one packed copy
            or model.lm_head.weight is lm.embed_tokens.weight)
    lm.embed_tokens = VocabParallelEmbedding(lm.embed_tokens, tp)
    model.lm_head = ParallelLMHead(model.lm_head, tp, lm.embed_tokens if tied else None)
    for layer in lm.layers:
        shard_attention(layer.self_attn, tp)
        shard_mlp(layer.mlp, tp)
    return model
