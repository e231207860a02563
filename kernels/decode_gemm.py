"""The decode-rows GEMM on AVX-512 and AVX2 CPUs (csrc/decode_gemm_cpu.cpp): y = x · wᵀ (+ bias) in x's
dtype, fp32 (FMA) or bf16 (vdpbf16ps where the CPU has AVX512_BF16; on AVX2 widened in registers), on
a weight packed once for it. On AVX-512 from 8 to 64 rows it measured 1.1-1.4x oneDNN's inner product
on oneDNN's own packed weight (one Zen 5 core, each of the benchmark model's eight layers' weights
from memory, as in a decode step); on AVX2 (Zen 3) 1.3-2.2x the small-row kernel and oneDNN up to 128
rows; at prefill sizes oneDNN is level or ahead, so vlserve.cpu.gemm sends only these rows here.
Where the CPU has AMX, bf16 rows up to amx_max_rows() run on the tiles instead, B tiles read straight
from the same packed weight: streamed once, in order, the tiles far ahead of memory.

Built with the CPU attention kernel (cpu_attention.py); `decode_gemm_op(dtype)` is None where that
extension cannot be built or the CPU (the build is -march=native) lacks the instructions.
"""

import functools

import torch

from .cpu_attention import cpu_attention_error, cpu_attention_op


@functools.cache
def decode_gemm_op(dtype: torch.dtype):
    """torch.ops.vlserve_decode_gemm where the kernel runs `dtype` here, else None."""
    if cpu_attention_op() is None or not torch.ops.vlserve_decode_gemm.supports(dtype):
        return None
    return torch.ops.vlserve_decode_gemm


def _ops():
    """The ops, built and loaded on first use (the extension is the CPU attention kernel's)."""
    if cpu_attention_op() is None:
        raise RuntimeError(f"the CPU kernels could not be built here: {cpu_attention_error()}")
    return torch.ops.vlserve_decode_gemm


def vector_bits() -> int:
    """The vector width the kernel was built for: 512 (AVX-512), 256 (AVX2), 0 (not built)."""
    return _ops().vector_bits()


def amx_max_rows() -> int:
    """The most bf16 rows the kernel runs on AMX tiles here (an input width that is a multiple of 32);
    0 where the build has no AMX or the OS does not grant it."""
    return _ops().amx_max_rows()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] fp32 or bf16 -> the kernel's packed copy ([ceil(N/16), K or ceil(K/2), 16] int32 words)."""
    return _ops().pack_weight(weight)


def packed_bytes(out_features: int, in_features: int, dtype: torch.dtype) -> int:
    """The bytes pack() makes of an [out_features, in_features] weight: blocks of 16 columns (the last
    zero padded), steps of one fp32 or two bf16 elements of K in 32-bit words."""
    steps = -(-in_features // 2) if dtype == torch.bfloat16 else in_features
    return -(-out_features // 16) * 16 * steps * 4


def unpack(packed: torch.Tensor, out_features: int, in_features: int, dtype: torch.dtype,
           columns: range | None = None) -> torch.Tensor:
    """pack()'s inverse: the plain [out_features, in_features] weight (or its rows `columns`, whose
    start is a multiple of 16), a new tensor."""
    first, last = (0, out_features) if columns is None else (columns.start, columns.stop)
    blocks = packed[first // 16: -(-last // 16)]
    if dtype == torch.bfloat16:  # a word is (w[c][2s], w[c][2s + 1]), the first in its low half
        plain = blocks.view(torch.bfloat16).unflatten(-1, (16, 2)).permute(0, 2, 1, 3).reshape(-1, 2 * packed.shape[1])
        plain = plain[:, :in_features]
    else:
        plain = blocks.view(torch.float32).permute(0, 2, 1).reshape(-1, in_features)
    return plain[:last - first].contiguous()


def gather_rows(packed: torch.Tensor, ids: torch.Tensor, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` of the plain weight ([*ids.shape, in_features], a new tensor), read from its packed
    layout: row n is lane n % 16 of block n // 16 at every step (a tied embedding's lookup)."""
    flat = ids.reshape(-1)
    words = packed[flat // 16, :, flat % 16]  # [rows, steps] 32-bit words: fp32 elements or bf16 pairs
    return words.view(dtype)[:, :in_features].reshape(*ids.shape, in_features)


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    return _ops().linear(x, packed, out_features, bias)
