"""The decode-rows GEMM (kernels/csrc/decode_gemm_cpu.cpp), fp32 and bf16, against fp32 products of
the same operands, on every remainder its blocking has (rows past a 6- or 4-row block, a 96-row
panel and a 512-row block, columns past a 16-column block and a 4-block group, K past a 128- or 256-step chunk), and
CpuLinear's use of it. Built with -march=native, it runs AVX-512 or AVX2 code: these tests check
whichever this CPU has; on a CPU with AMX, bf16 rows up to 48 with K a multiple of 32 (the cases
with 6, 24, 31, 40, 48 and 17 rows) run on its tiles in row groups of 16, the last one partial."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vlserve.kernels import decode_gemm
from vlserve.cpu import gemm as cpu_gemm
from vlserve.cpu.gemm import PACKED_KERNEL_ROWS, CpuLinear, use_cpu_gemm

from test_cpu_attention import cpu_flags, cpu_has_avx512_bf16


FLAGS = cpu_flags()
AVX2 = {"avx2", "fma"} <= FLAGS and "avx512f" not in FLAGS  # the AVX2 build: fp32 and bf16 (widened)
CPU_HAS = {torch.float32: "avx512f" in FLAGS or AVX2, torch.bfloat16: cpu_has_avx512_bf16() or AVX2}
DTYPES = [pytest.param(d, marks=pytest.mark.skipif(not CPU_HAS[d], reason=f"the CPU lacks the instructions for {d}"))
          for d in CPU_HAS]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7}  # bf16: one rounding step of the output


@pytest.mark.parametrize("dtype", list(CPU_HAS))
def test_kernel_is_built_where_the_cpu_has_the_instructions(dtype):
    # Built with -march=native: on such a CPU it must be there, or every decode row silently takes
    # oneDNN and the tests below test nothing.
    assert (decode_gemm.decode_gemm_op(dtype) is not None) == CPU_HAS[dtype]
    if any(CPU_HAS.values()):
        assert decode_gemm.vector_bits() == (256 if AVX2 else 512)


def test_amx_tiles_are_used_where_the_cpu_has_them():
    # Built with -march=native on a CPU with AMX-BF16 (whose flags Linux lists only where it grants
    # the tile state), bf16 decode rows must run on the tiles, or the cases below test vdpbf16ps only.
    expected = 48 if {"amx_bf16", "amx_tile"} <= FLAGS and cpu_has_avx512_bf16() else 0
    assert decode_gemm.amx_max_rows() == expected


def _exact(x, w, bias):
    """fp32 products of the operands (exact for bf16), the bias in fp32, one rounding to x's dtype:
    what the kernel computes, up to the order of its sums."""
    out = x.float() @ w.float().T
    return (out + bias.float() if bias is not None else out).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 16, 2), (5, 17, 30), (6, 64, 64), (7, 65, 258), (24, 1536, 1024),
                                   (31, 100, 2816), (97, 200, 512), (200, 48, 96), (9, 40, 1030),
                                   (40, 48, 96), (48, 33, 64), (17, 16, 32), (1100, 40, 130)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_the_exact_product(dtype, m, n, k, bias, threads):
    torch.manual_seed(m * 1000 + n + k)
    w = torch.randn(n, k).to(dtype)
    x = torch.randn(m, k).to(dtype)
    b = torch.randn(n).to(dtype) if bias else None
    out = decode_gemm.linear(x, decode_gemm.pack(w), n, b)
    exact = _exact(x, w, b)
    assert out.dtype == dtype and out.shape == (m, n)
    scale = exact.float().abs().amax(dim=1, keepdim=True) + 1e-6  # relative to the row's size
    assert ((out.float() - exact.float()).abs() / scale).max() <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_odd_k_in_fp32(dtype):
    w, x = torch.randn(20, 33).to(dtype), torch.randn(9, 33).to(dtype)
    if dtype == torch.bfloat16:  # a pair of K per step: an odd K is refused, and CpuLinear never sends one
        with pytest.raises(RuntimeError, match="even"):
            decode_gemm.linear(x, decode_gemm.pack(w), 20, None)
        return
    torch.testing.assert_close(decode_gemm.linear(x, decode_gemm.pack(w), 20, None), x @ w.T, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_leading_dims_and_a_strided_input(dtype):
    torch.manual_seed(1)
    w = torch.randn(40, 64).to(dtype)
    x = torch.randn(3, 4, 128).to(dtype)[..., ::2]  # [3, 4, 64], not contiguous
    out = decode_gemm.linear(x, decode_gemm.pack(w), 40, None)
    assert out.shape == (3, 4, 40)
    torch.testing.assert_close(out.float(), _exact(x.reshape(12, 64), w, None).float().reshape(3, 4, 40),
                               atol=0.05, rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rejects_what_it_cannot_compute(dtype):
    packed = decode_gemm.pack(torch.randn(16, 64).to(dtype))
    with pytest.raises(RuntimeError, match="features"):
        decode_gemm.linear(torch.randn(2, 62).to(dtype), packed, 16, None)
    with pytest.raises(RuntimeError, match="dtype"):
        decode_gemm.linear(torch.randn(2, 64).half(), packed, 16, None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 24, 64, 65, 128, 129, 300])
def test_cpu_linear_takes_it_on_the_packed_layout(dtype, rows, monkeypatch):
    taken = cpu_gemm.packed_kernel_rows(dtype)
    amx = dtype == torch.bfloat16 and cpu_gemm.amx_bf16() and cpu_gemm.native_bf16()
    expected = cpu_gemm.amx_bf16_kernel_rows() if amx else PACKED_KERNEL_ROWS[decode_gemm.vector_bits()][dtype]
    assert taken == expected, "the kernel is built but never used, or takes rows oneDNN's AMX path runs faster"
    calls = []
    real = decode_gemm.linear
    monkeypatch.setattr(decode_gemm, "linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    torch.manual_seed(rows)
    plain = nn.Linear(96, 72).to(dtype)
    fast = nn.Linear(96, 72).to(dtype)
    fast.load_state_dict(plain.state_dict())
    fast = use_cpu_gemm(fast)
    assert isinstance(fast, CpuLinear) and fast.packed is not None and "weight" not in fast._parameters
    x = torch.randn(rows, 96).to(dtype)
    out = fast(x)
    assert calls == ([rows] if rows in taken else [])
    exact = F.linear(x.float(), plain.weight.float(), plain.bias.float())
    assert (out.float() - exact).abs().max() <= 2 * (plain(x).float() - exact).abs().max() + 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(72, 96), (37, 64), (16, 2), (100, 30)])
def test_unpack_gives_back_the_weight(dtype, n, k):
    w = torch.randn(n, k).to(dtype)
    packed = decode_gemm.pack(w)
    assert packed.numel() * packed.element_size() == decode_gemm.packed_bytes(n, k, dtype)
    assert torch.equal(decode_gemm.unpack(packed, n, k, dtype), w)
    assert torch.equal(decode_gemm.unpack(packed, n, k, dtype, range(16, n)), w[16:])
