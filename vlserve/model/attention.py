"""Attention backends: how a decoder layer attends over the paged KV pool.

All read every key and value through req_to_token (the new tokens' KV is written to the pool
before attention runs). `torch` is the default without CUDA: one batched C++ call per layer
(kernels/cpu_attention.py), built on first use, falling back to the references where it cannot be
built. `reference` runs the per-request PyTorch references (for comparisons); `triton` runs the
paged Triton kernels.
"""

import functools

import torch

from vlserve.core.forward_batch import ForwardBatch, ForwardMode


class AttentionBackend:
    def __init__(self, name: str):
        from vlserve import kernels

        if name == "torch":
            from vlserve.kernels import cpu_attention

            cpu_attention.cpu_attention_op()  # build (first use) or load it now, not in the first forward
            # one kernel for both modes: a decode batch is an extend of one token per request, and
            # the batch already holds those lengths and starts (decode_attention_cpu would build
            # them again, twice a layer)
            # (the batch's tensors are the engine's own: the kernel's checks stand, the Python ones are skipped)
            self._decode = None
            self._extend = functools.partial(cpu_attention.extend_attention_cpu, validate=False)
        elif name == "reference":
            self._decode, self._extend = kernels.decode_attention_ref, kernels.extend_attention_ref
        elif name == "triton":
            if not kernels.triton_available():
                raise ValueError("--attention-backend triton needs the triton package and a CUDA GPU "
                                 "(or TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter)")
            self._decode, self._extend = kernels.decode_attention, kernels.extend_attention
        else:
            raise ValueError(f"unknown attention backend {name!r}; use 'torch', 'reference' or 'triton'")
        self.name = name

    def forward(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                batch: ForwardBatch, sm_scale: float) -> torch.Tensor:
        """q: [T, Hq, D] → [T, Hq, D]."""
        o = torch.empty_like(q)
        if batch.mode == ForwardMode.DECODE and self._decode is not None:
            self._decode(q, k_buffer, v_buffer, o, batch.req_to_token, batch.req_pool_indices,
                         batch.seq_lens, sm_scale)
        else:
            self._extend(q, k_buffer, v_buffer, o, batch.req_to_token, batch.req_pool_indices,
                         batch.seq_lens, batch.extend_lens, batch.qo_start_loc, sm_scale)
        return o


def default_backend_name() -> str:
    return "triton" if torch.cuda.is_available() else "torch"
