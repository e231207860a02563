"""The paged KV pool: per-layer K and V buffers indexed by slot.

One pool holds every token's KV — cached prefixes in the radix tree and running requests alike.
A slot is one token's K and V in every layer; which slot a request's position uses is recorded in
the ReqToTokenPool table, so attention gathers KV through it.
"""

from dataclasses import dataclass

import torch

from vlserve.kernels.fused import fused_op


@dataclass
class KVPool:
    k_buffers: list[torch.Tensor]  # per layer: [num_slots, num_kv_heads, head_dim]
    v_buffers: list[torch.Tensor]

    @classmethod
    def create(cls, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
               dtype: torch.dtype, device: str | torch.device = "cpu") -> "KVPool":
        def buf():
            # Never zeroed: attention reads only slots that were written (up to each request's
            # length), and untouched pages of a large CPU pool then cost no resident memory.
            return torch.empty(num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)

        return cls([buf() for _ in range(num_layers)], [buf() for _ in range(num_layers)])

    @property
    def num_slots(self) -> int:
        return self.k_buffers[0].shape[0]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fused: bool = True) -> None:
        """k, v: [tokens, kv_heads, head_dim], stored at these slots of the layer's buffers (`fused`:
        through the fused store where there is one; KernelConfig.fused_ops)."""
        k_buf, v_buf = self.k_buffers[layer], self.v_buffers[layer]
        if k.dtype != k_buf.dtype or v.dtype != v_buf.dtype:  # .to costs 2-3 us even as a no-op
            k, v = k.to(k_buf.dtype), v.to(v_buf.dtype)
        op = fused_op(k_buf) if fused else None
        if op is not None and k.stride(-1) == 1 and v.stride(-1) == 1:
            op.store_kv(k_buf, v_buf, slots, k, v)  # row copies: 2-5x index_copy_ (benchmarks/kv_store.py at ba1d303)
            return
        # index_copy_, not buffer[slots] = k: on the CPU the indexed assignment (index_put_) took
        # 60 us for a 14-token extend against 10 us here, twice a layer on every step
        slots = slots.to(torch.int64)
        k_buf.index_copy_(0, slots, k)
        v_buf.index_copy_(0, slots, v)

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8
