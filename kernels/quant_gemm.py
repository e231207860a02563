"""The quantized GEMMs on the CPU (csrc/quant_int8_cpu.cpp, csrc/quant_int4_cpu.cpp), their packing
and their PyTorch references.

- W8A8 int8: x quantized per row at run time (max|x| / 127.5, round half to even, as
  compressed-tensors does), int8 x int8 sums exact in int32, then x_scale · w_scale (+ bias) in fp32.
  On AMX (tdpbssd, from 9 rows, K a multiple of 64), AVX512-VNNI (vpdpbusd) or AVX2 (vpmaddwd),
  chosen at run time by the CPU's flags and the call's shape.
- W4A16: int4 groups unpacked and scaled in registers for decode rows (AVX-512; bf16 rows on
  AVX512-BF16's vdpbf16ps, the nibbles made bf16 by their exponent bits); for prefill rows the
  weight is unpacked to a full-precision matrix once per call and BLAS runs the product.
Weights are packed once, at load (pack_int8, pack_int4).

One extension of its own, built on first use like the CPU attention kernel (cpu_attention.py) and
named by the sources' hash. It is built for any x86-64 CPU (no -march=native): each vector path
carries its own target attribute and runs only where the CPU has the flags. Where it cannot be built,
a warning says why, once, and the references run.
"""

import hashlib
import os
import threading
import warnings

import torch

_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
_SOURCES = [os.path.join(_DIR, name) for name in ("quant_int8_cpu.cpp", "quant_int4_cpu.cpp")]
_HEADERS = [os.path.join(_DIR, "amx_cpu.h")]  # the tile scope; part of the build's name
_lock = threading.Lock()
_loaded: dict[str, object] = {}  # "ok": True, or "error": why it could not be built

ISA_AVX2, ISA_VNNI, ISA_AMX = 1, 2, 3
INT8_QMAX = 127.5  # compressed-tensors' symmetric int8 range: (127 - (-128)) / 2


def _build() -> None:
    from torch.utils import cpp_extension

    from .cpu_attention import clear_stale_build_lock

    digest = hashlib.sha1()
    for path in _SOURCES + _HEADERS:
        with open(path, "rb") as f:
            digest.update(f.read())
    name = "vlserve_quant_gemm_" + digest.hexdigest()[:10]
    if hasattr(cpp_extension, "_get_build_directory"):
        clear_stale_build_lock(cpp_extension._get_build_directory(name, verbose=False))
    cpp_extension.load(name=name, sources=_SOURCES, extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"],
                       is_python_module=False, verbose=False)


def available() -> bool:
    """Whether the extension is built and loaded here (after one warning when it cannot be)."""
    if "ok" in _loaded or "error" in _loaded:
        return "ok" in _loaded
    with _lock:
        if "ok" not in _loaded and "error" not in _loaded:
            try:
                _build()
                _loaded["ok"] = True
            except Exception as e:  # no compiler, not x86: the references run
                _loaded["error"] = f"{type(e).__name__}: {e}"
                warnings.warn(f"vlserve: the quantized CPU GEMMs could not be built ({_loaded['error'][:300]}); "
                              "quantized layers run the PyTorch references", RuntimeWarning, stacklevel=2)
    return "ok" in _loaded


def build_error() -> str | None:
    return _loaded.get("error")


_resolved: dict[tuple[str, str], object] = {}  # (namespace, name) -> the op's default overload


def _op(namespace: str, name: str):
    """torch.ops.<namespace>.<name>.default, the extension built and loaded first; resolved once (a
    decode step calls these ops dozens of times; the lookup through torch.ops took ~0.3 us a call)."""
    op = _resolved.get((namespace, name))
    if op is None:
        if not available():
            raise RuntimeError(f"the quantized CPU GEMMs could not be built here: {build_error()}")
        op = _resolved[(namespace, name)] = getattr(getattr(torch.ops, namespace), name).default
    return op


def int8_isa() -> int:
    """The best int8 path here: ISA_AMX (VNNI for decode rows and K not a multiple of 64), ISA_VNNI,
    ISA_AVX2, or 0 (not built, or none: the reference runs). An explicit isa of ISA_AMX runs the tiles
    at any row count (K permitting)."""
    return int(torch.ops.vlserve_int8.int8_isa()) if available() else 0


def int4_supported() -> bool:
    """Whether the W4A16 decode kernel runs here (AVX-512)."""
    return available() and bool(torch.ops.vlserve_int4.int4_supported())


# ---- W8A8 ------------------------------------------------------------------------------------------

def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [N, K] -> (packed [N/16, K/4, 16, 4] int8, comp [N/16·16] int32 = 128 · Σ_k w)."""
    return _op("vlserve_int8", "pack_int8")(weight)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] fp32 or bf16 (read as it is) -> (int8 [M, K rounded up to 4], zero padded; fp32 scale [M])."""
    return _op("vlserve_int8", "quantize_rows")(x)


def int8_gemm_int32(xq: torch.Tensor, packed: torch.Tensor, comp: torch.Tensor, n: int, isa: int = -1) -> torch.Tensor:
    """The exact int32 sums xq · wᵀ (the GEMM's integer part alone)."""
    return _op("vlserve_int8", "int8_gemm_int32")(xq, packed, comp, n, isa)


def int8_linear(x: torch.Tensor, packed: torch.Tensor, comp: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None, isa: int = -1) -> torch.Tensor:
    """[M, K] float -> [M, N]: x quantized per row, the int8 GEMM, x_scale · w_scale (+ bias) in fp32;
    bf16 out (rounded once) for a bf16 x, else fp32."""
    return _op("vlserve_int8", "int8_linear")(x, packed, comp, w_scale, bias, isa)


def int8_linear_quantized(xq: torch.Tensor, x_scale: torch.Tensor, packed: torch.Tensor, comp: torch.Tensor,
                          w_scale: torch.Tensor, bias: torch.Tensor | None, bf16: bool, isa: int = -1) -> torch.Tensor:
    """int8_linear on rows already quantized (quantize_rows, or a norm that quantized its output:
    fused.py's rms_norm_quant); bf16 out where `bf16`, else fp32."""
    return _op("vlserve_int8", "int8_linear_quantized")(xq, x_scale, packed, comp, w_scale, bias, bf16, isa)


def quantize_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.float()
    scale = (x.abs().amax(dim=-1) / INT8_QMAX).clamp(min=torch.finfo(torch.float32).eps)
    q = torch.round(x / scale[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scale


def int8_linear_ref(x: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """The reference: sums in float64 (exact for int8 products up to K of 2^38), the epilogue in fp32."""
    q, scale = quantize_rows_ref(x)
    sums = (q.double() @ weight.double().t()).float()
    y = sums * (scale[:, None] * w_scale.float().view(1, -1))
    return y if bias is None else y + bias.float()


# ---- W4A16 -----------------------------------------------------------------------------------------

def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 q [N, K] in [-8, 7], scale [N, K/G], zero points [N, K/G] or None -> (packed [N/16, K/8, 16]
    int32 words of eight q + 8, elements 2j and 2j + 1 at bits 4j and 16 + 4j, each four blocks of 16
    columns interleaved step by step; [N/16, K/G, 2, 16] fp32 of scale and scale · (8 + zero), or with
    no zero points [N/16, K/G, 1, 16] of scale alone)."""
    return _op("vlserve_int4", "pack_int4")(q, scale, zero)


def int4_decode(x: torch.Tensor, packed: torch.Tensor, sc: torch.Tensor, bias: torch.Tensor | None,
                n: int) -> torch.Tensor:
    """[M, K] -> [M, N], unpacked and scaled in registers (decode rows): bf16 (rounded once) for a bf16
    x where the CPU has AVX512-BF16, else fp32."""
    return _op("vlserve_int4", "decode_int4")(x, packed, sc, bias, n)


def int4_dequantize(packed: torch.Tensor, sc: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The packed weight as a [N, K] matrix of `dtype` (prefill rows run BLAS on it)."""
    return _op("vlserve_int4", "dequantize_int4")(packed, sc, n, dtype)


def int4_dequantize_ref(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> torch.Tensor:
    """(q - zero) · scale per group, fp32 [N, K]."""
    n, k = q.shape
    groups = scale.shape[1]
    w = q.float().view(n, groups, k // groups)
    if zero is not None:
        w = w - zero.float().unsqueeze(-1)
    return (w * scale.float().unsqueeze(-1)).view(n, k)
