"""The GEMM path every linear layer takes on the CPU, chosen by measurement (benchmarks/gemm_paths.py).

torch's CPU build ships two GEMM libraries: MKL (what F.linear calls for fp32) and oneDNN. On the
AVX2 AMD EPYC measured here, MKL's sgemm is slowest exactly where serving runs, at a few to a few
dozen rows (decode batches): oneDNN's inner product on the same plain weight was 1.1–4x faster from
4 rows up, and about level at thousands of rows; at one row MKL's gemv was fastest. oneDNN takes the
weight as it is (no packed copy, no extra memory): packing it for one batch size measured no faster,
and the batch size changes every step anyway.

Below SMALL_ROWS (1–31 rows: decode batches, a follow-up question's few tokens) both libraries fall
to a third of the core's rate, so those rows go to our own register-blocked kernel
(vlserve.kernels.small_gemm), which reads the weight once and reuses it from L1 for every row:
on this AVX2 CPU 1.0–1.7x oneDNN on one thread and 1.1–2x on two up to 24 rows, about level at 31
(benchmarks/RESULTS.md, "Third pass"). Where the kernel cannot be built, the BLAS paths
below serve every size.

bf16: where oneDNN has native bf16 kernels (AVX512_BF16 / AMX), F.linear in bf16 already runs
through them. Without them (AVX2), torch's bf16 GEMM fallback is 3–6x slower than fp32 at prefill
sizes, so bf16 weights are widened to fp32 for that call from UPCAST_MIN_ROWS rows up (the
widening reads the weight once; the GEMM then reads it once per row block) and kept as they are
below, where the GEMM is memory-bound and bf16's halved weight traffic wins.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

from vlserve.kernels import small_gemm

ONEDNN_MIN_ROWS = 4  # below this MKL's gemv / small sgemm was level or faster
SMALL_ROWS = small_gemm.MAX_ROWS  # below this, our small-row kernel
UPCAST_MIN_ROWS = 16  # bf16 without native kernels: from here the fp32 GEMM on a widened weight wins


@functools.cache
def native_bf16() -> bool:
    """Whether oneDNN has bf16 GEMM kernels on this CPU (AVX512_BF16, AVX512-BW or AMX)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@functools.cache
def native_fp16() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_fp16_supported()


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class CpuLinear(nn.Linear):
    """nn.Linear with the measured CPU GEMM path; same parameters and state-dict keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cpu or x.dim() == 0:
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if 0 < rows < SMALL_ROWS and x.dtype in (torch.float32, torch.bfloat16) and self.weight.dtype == x.dtype:
            op = small_gemm.small_linear_op()
            if op is not None and (x.dtype == torch.float32 or not native_bf16()):
                return op(x.float(), self.weight, self.bias).to(x.dtype)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            if rows >= ONEDNN_MIN_ROWS:
                return _onednn(x, self.weight, self.bias)
        elif x.dtype == torch.bfloat16 and rows >= UPCAST_MIN_ROWS and not native_bf16():
            bias = None if self.bias is None else self.bias.float()
            return _onednn(x.float(), self.weight.float(), bias).to(torch.bfloat16)
        return F.linear(x, self.weight, self.bias)


def use_cpu_gemm(model: nn.Module) -> int:
    """Switches every plain nn.Linear in `model` (decoder, projector, vision tower) to CpuLinear in
    place, keeping its parameters; returns how many. A no-op without oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return 0
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = CpuLinear
            count += 1
    return count
