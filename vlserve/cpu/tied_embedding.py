"""An embedding whose rows are read from a tied LM head's packed layout: one resident copy serves both.

With tied word embeddings the LM head and the embedding are one [vocab, hidden] matrix (Qwen2-0.5B:
151,936 x 896, 27% of a decode step's weight bytes). The LM head streams it through our kernel,
which wants the packed layout (kernels/decode_gemm.py); the embedding looks up a few rows per step.
So the head keeps the packed layout alone and the embedding gathers its rows from it: row n lies at
block n // 16, lane n % 16 of every step, one 32-bit word per step (fp32: an element; bf16: a pair).
The gather is strided but small: a decode step's tokens, a prefill's once (~10 us a row in fp32).
"""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from vlserve.kernels import decode_gemm

if TYPE_CHECKING:
    from vlserve.cpu.gemm import CpuLinear


class PackedRowsEmbedding(nn.Module):
    """nn.Embedding's lookup (and state-dict key `weight`) over the weight of `head`, a CpuLinear it is
    tied to; the rows come from the head's packed layout, or its plain weight while it has none."""

    def __init__(self, head: "CpuLinear"):
        super().__init__()
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self.__dict__["head"] = head  # not a submodule: the head is the LM head's, where it is saved

    @classmethod
    def tie(cls, embedding: nn.Embedding, head: "CpuLinear") -> "PackedRowsEmbedding | None":
        """The embedding's replacement, where it is a plain lookup of exactly the head's weight."""
        if type(embedding) is not nn.Embedding or embedding.max_norm is not None:
            return None
        if head._parameters.get("weight") is not embedding.weight or not head.packable():
            return None
        return cls(head)

    @property
    def weight(self) -> torch.Tensor:
        """The plain [vocab, hidden] weight: the head's (derived from its packed layout: a copy)."""
        return self.__dict__["head"].weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        head = self.__dict__["head"]
        if head.packed is None:
            return F.embedding(ids, head.weight)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            raise IndexError(f"embedding ids must lie in [0, {self.num_embeddings}), got "
                             f"[{int(ids.min())}, {int(ids.max())}]")
        return decode_gemm.gather_rows(head.packed, ids, self.embedding_dim, head.weight_dtype())

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.weight

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        weight = state_dict.get(prefix + "weight")
        if weight is None:
            missing_keys.append(prefix + "weight")
            return
        head = self.__dict__["head"]
        if tuple(weight.shape) != (head.out_features, head.in_features):
            error_msgs.append(f"size mismatch for {prefix}weight: {tuple(weight.shape)} in the state dict, "
                              f"{(head.out_features, head.in_features)} here")
            return
        head.weight = nn.Parameter(weight.to(head.weight_dtype()), requires_grad=False)
        head.pack()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows read from the tied LM head's packed layout"


def tie_embeddings(model: nn.Module, heads: list["CpuLinear"]) -> list[str]:
    """Replaces each nn.Embedding of `model` whose weight is one of `heads`' by a PackedRowsEmbedding
    over that head (before packing: the head's packed layout is then the weight's only copy); returns
    the replaced embeddings' names."""
    by_weight = {id(h._parameters["weight"]): h for h in heads if h._parameters.get("weight") is not None}
    tied = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            head = by_weight.get(id(getattr(child, "weight", None)))
            replacement = None if head is None else PackedRowsEmbedding.tie(child, head)
            if replacement is not None:
                setattr(parent, name, replacement)
                tied.append(f"{parent_name}.{name}" if parent_name else name)
    return tied
