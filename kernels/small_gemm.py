"""The small-row GEMM on the CPU: y = x · wᵀ (+ bias) for the 1–31 rows that decode batches and short
follow-up prompts run, where MKL and oneDNN reach a third of the core's rate (csrc/small_gemm_cpu.cpp;
benchmarks/gemm_paths.py at ba1d303). Weights fp32 or bf16 (widened on load), x and y fp32.

Built with the CPU attention kernel (cpu_attention.py): where that extension cannot be built, this
is unavailable too and callers keep their BLAS path.
"""

import torch

from .cpu_attention import cpu_attention_op

MAX_ROWS = 32  # from here oneDNN's blocked GEMM is level or faster


def small_linear_op():
    """The compiled op, or None where the CPU kernels could not be built (cpu_attention says why)."""
    return torch.ops.vlserve_gemm.small_linear if cpu_attention_op() is not None else None
