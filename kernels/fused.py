"""A decoder layer's elementwise steps fused on the CPU (csrc/fused_cpu.cpp): RMSNorm, the residual add
with the norm after it, SiLU(gate) * up, rotary embedding in place. Each is one pass and one parallel
region where eager PyTorch runs several ops; outputs round as transformers' unfused ops do.

Built with the CPU attention kernel (cpu_attention.py); where that extension cannot be built, or the
tensors are not on the CPU, callers keep their PyTorch code (`fused_op` returns None).
"""

import torch

from .cpu_attention import cpu_attention_op


def fused_op(x: torch.Tensor):
    """torch.ops.vlserve_fused for a CPU tensor where the extension built; else None."""
    if not x.is_cpu or cpu_attention_op() is None:
        return None
    return torch.ops.vlserve_fused
