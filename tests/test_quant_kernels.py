"""The quantized CPU GEMMs (kernels/quant_gemm.py) against their PyTorch references: the int8 sums
exactly, the fp32 epilogues to 1e-5, on every path this CPU has (AMX, AVX512-VNNI and AVX2 for int8)."""

import pytest
import torch

from vlserve.kernels import quant_gemm

# shapes: edges of every block size (rows 1-6 cross the VNNI 6-row x 4-block tile, 7-32 the 8 x 3 one
# and AVX2's 4-row blocks; N not a multiple of 16, 48 or 64; K not a multiple of 4), a decode-sized layer,
# and AMX's edges (K a multiple of 64, which it needs; rows across its 16-row tiles and 32-row passes)
INT8_SHAPES = [(1, 64, 16), (5, 70, 33), (7, 130, 100), (8, 96, 80), (9, 130, 100), (13, 64, 257),
               (32, 512, 384), (16, 128, 48), (17, 192, 40), (33, 256, 100), (80, 1024, 96)]
INT4_SHAPES = [(1, 64, 16, 32), (3, 128, 40, 64), (6, 256, 200, 128), (17, 512, 96, 32)]


@pytest.fixture(scope="module")
def built():
    assert quant_gemm.available(), f"the quantized CPU GEMMs did not build: {quant_gemm.build_error()}"


def int8_isas():
    isa = quant_gemm.int8_isa()
    return [i for i in (quant_gemm.ISA_AVX2, quant_gemm.ISA_VNNI, quant_gemm.ISA_AMX) if i <= isa]


def _int8_case(m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    w[0, :] = 127  # the largest sums: every product 127 · 127 or -128 · 127
    return x, w, torch.rand(n, generator=g) / 100 + 1e-3, torch.randn(n, generator=g)


def test_a_path_runs_here(built):
    assert quant_gemm.int8_isa() in (quant_gemm.ISA_AVX2, quant_gemm.ISA_VNNI, quant_gemm.ISA_AMX)


def test_row_quantization_matches_compressed_tensors_rounding(built):
    x = torch.randn(9, 37) * 5
    x[3] = 0  # an all-zero row: zeros, not NaNs
    x[4, :4] = torch.tensor([127.5, -1.5, 0.5, 2.5])  # ties round to even
    q, scale = quant_gemm.quantize_rows(x)
    q_ref, scale_ref = quant_gemm.quantize_rows_ref(x)
    assert q.shape == (9, 40) and (q[:, 37:] == 0).all()
    assert torch.equal(q[:, :37], q_ref)
    assert torch.equal(scale, scale_ref)


@pytest.mark.parametrize("shape", INT8_SHAPES, ids=str)
def test_int8_sums_are_exact(built, shape):
    m, k, n = shape
    x, w, _, _ = _int8_case(m, k, n, seed=m)
    q, _ = quant_gemm.quantize_rows(x)
    q[0, :k] = -128  # the most negative activation against the most positive weights
    packed, comp = quant_gemm.pack_int8(w)
    ref = (q[:, :k].long() @ w.long().t()).to(torch.int32)
    for isa in int8_isas():
        assert torch.equal(quant_gemm.int8_gemm_int32(q, packed, comp, n, isa), ref), f"isa {isa}"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("shape", INT8_SHAPES, ids=str)
def test_int8_linear_matches_reference(built, shape, bias):
    m, k, n = shape
    x, w, w_scale, b = _int8_case(m, k, n, seed=n)
    b = b if bias else None
    packed, comp = quant_gemm.pack_int8(w)
    ref = quant_gemm.int8_linear_ref(x, w, w_scale, b)
    for isa in int8_isas():
        y = quant_gemm.int8_linear(x, packed, comp, w_scale, b, isa)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5, msg=lambda e: f"isa {isa}: {e}")


@pytest.mark.parametrize("shape", INT8_SHAPES, ids=str)
def test_int8_linear_reads_and_writes_bf16(built, shape):
    """A bf16 input is quantized as its fp32 value, and the fp32 epilogue is rounded to bf16 once."""
    m, k, n = shape
    x, w, w_scale, b = _int8_case(m, k, n, seed=k)
    x = x.bfloat16()
    packed, comp = quant_gemm.pack_int8(w)
    q, scale = quant_gemm.quantize_rows(x)
    q_ref, scale_ref = quant_gemm.quantize_rows_ref(x)
    assert torch.equal(q[:, :k], q_ref) and torch.equal(scale, scale_ref)
    ref = quant_gemm.int8_linear_ref(x, w, w_scale, b)
    for isa in int8_isas():
        y = quant_gemm.int8_linear(x, packed, comp, w_scale, b, isa)
        assert y.dtype == torch.bfloat16
        # one rounding to bf16 of values equal to 1e-5: at most one bf16 step apart
        torch.testing.assert_close(y.float(), ref.bfloat16().float(), rtol=2 ** -7, atol=1e-5,
                                   msg=lambda e: f"isa {isa}: {e}")


def _int4_case(m, k, n, group, symmetric, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, k // group, generator=g) / 10 + 1e-3
    zero = None if symmetric else torch.randint(-8, 8, (n, k // group), generator=g, dtype=torch.int8)
    return torch.randn(m, k, generator=g), q, scale, zero


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("shape", INT4_SHAPES, ids=str)
def test_int4_decode_and_dequantize_match_reference(built, shape, symmetric):
    m, k, n, group = shape
    x, q, scale, zero = _int4_case(m, k, n, group, symmetric, seed=k + n)
    packed, sc = quant_gemm.pack_int4(q, scale, zero)
    w_ref = quant_gemm.int4_dequantize_ref(q, scale, zero)
    torch.testing.assert_close(quant_gemm.int4_dequantize(packed, sc, n, torch.float32), w_ref, rtol=1e-5, atol=1e-6)
    if not quant_gemm.int4_supported():
        pytest.fail("the W4A16 decode kernel needs AVX-512, which this CPU lacks")
    bias = torch.randn(n)
    ref = x.double() @ w_ref.double().t() + bias.double()
    y = quant_gemm.int4_decode(x, packed, sc, bias, n)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mean", [0.0, 4.0], ids=["centred", "mean-4"])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("shape", INT4_SHAPES, ids=str)
def test_int4_decode_of_bf16_rows(built, shape, symmetric, mean):
    """A bf16 x runs the bf16 path (weights as 128 + nibble, 128 · Σ x taken off per group): bf16 out
    (where the CPU has AVX512-BF16), one rounding from the exact product of the bf16 values. A mean of 4
    makes Σ x large against the products, the case where taking 128 · Σ x off cancels most."""
    m, k, n, group = shape
    x, q, scale, zero = _int4_case(m, k, n, group, symmetric, seed=m + k)
    x = (x + mean).bfloat16()
    packed, sc = quant_gemm.pack_int4(q, scale, zero)
    if not quant_gemm.int4_supported():
        pytest.fail("the W4A16 decode kernel needs AVX-512, which this CPU lacks")
    bias = torch.randn(n)
    ref = x.double() @ quant_gemm.int4_dequantize_ref(q, scale, zero).double().t() + bias.double()
    y = quant_gemm.int4_decode(x, packed, sc, bias, n)
    assert y.dtype in (torch.bfloat16, torch.float32)
    # one bf16 rounding (2^-8 relative); the fp32 sums' error is ~1e-5 of Σ|x·w|, under atol here
    torch.testing.assert_close(y.double(), ref, rtol=2 ** -8, atol=2e-3)


# ---- the norm before W8A8 projections, quantizing its own output ----------------------------------

NORM_WIDTHS = [64, 70, 1537]  # a multiple of the vector width, a tail of 6, an odd width (q padded to 4)


@pytest.fixture(scope="module")
def fused():
    from vlserve.kernels.fused import fused_op
    op = fused_op(torch.zeros(1))
    assert op is not None, "the fused CPU kernels did not build"
    return op


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("width", NORM_WIDTHS, ids=str)
def test_norm_quant_gives_the_bytes_of_quantizing_the_norm_output(built, fused, width, dtype):
    """rms_norm_quant / add_rms_norm_quant = quantize_rows of rms_norm's output, exactly (scales too)."""
    g = torch.Generator().manual_seed(width)
    x, a = (torch.randn(9, width, generator=g) * 4).to(dtype), torch.randn(9, width, generator=g).to(dtype)
    w = (torch.rand(width, generator=g) + 0.5).to(dtype)
    x[2] = 0  # an all-zero row: zero codes, the epsilon scale
    q, scale = fused.rms_norm_quant(x, w, 1e-5)
    q_ref, scale_ref = quant_gemm.quantize_rows(fused.rms_norm(x, w, 1e-5))
    assert q.shape == (9, (width + 3) // 4 * 4) and torch.equal(q, q_ref) and torch.equal(scale, scale_ref)
    stream, q, scale = fused.add_rms_norm_quant(x, a, w, 1e-5)
    stream_ref, h = fused.add_rms_norm(x, a, w, 1e-5)
    q_ref, scale_ref = quant_gemm.quantize_rows(h)
    assert torch.equal(stream, stream_ref) and torch.equal(q, q_ref) and torch.equal(scale, scale_ref)
    assert torch.equal(q[:, :width], quant_gemm.quantize_rows_ref(h)[0])  # compressed-tensors' rounding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("inner", [70, 100, 1537, 4096], ids=str)
def test_silu_mul_quant_gives_the_bytes_of_quantizing_silu_mul(built, fused, inner, dtype):
    """silu_mul_quant = quantize_rows of silu_mul's output, exactly (scales too); 9 rows of 4096 are
    two tasks where two threads run."""
    g = torch.Generator().manual_seed(inner)
    gate_up = (torch.randn(9, 2 * inner, generator=g) * 3).to(dtype)
    gate_up[4] = 0  # an all-zero row: zero codes, the epsilon scale
    q, scale = fused.silu_mul_quant(gate_up)
    q_ref, scale_ref = quant_gemm.quantize_rows(fused.silu_mul(gate_up))
    assert q.shape == (9, (inner + 3) // 4 * 4) and torch.equal(q, q_ref) and torch.equal(scale, scale_ref)
    assert torch.equal(q[:, :inner], quant_gemm.quantize_rows_ref(fused.silu_mul(gate_up))[0])
    with pytest.raises(RuntimeError, match="even"):
        fused.silu_mul_quant(gate_up[:, :5])


def test_norm_quant_rounds_ties_to_even(built, fused):
    """x of ones normalises to itself, so the norm's output is its weight: values whose x / scale is a
    tie (scale 1: max 127.5) round to even, and 127.5 clamps to 127."""
    ties = torch.tensor([127.5, 2.5, -2.5, 0.5, -0.5, 1.5, 3.5, -126.5] * 3)
    q, scale = fused.rms_norm_quant(torch.ones(1, 24), ties, 0.0)
    assert scale.item() == 1.0
    assert q[0].tolist() == [127, 2, -2, 0, 0, 2, 4, -126] * 3


@pytest.mark.parametrize("shape", INT8_SHAPES, ids=str)
def test_int8_linear_on_quantized_rows_equals_int8_linear(built, shape):
    m, k, n = shape
    x, w, w_scale, b = _int8_case(m, k, n, seed=m + k)
    packed, comp = quant_gemm.pack_int8(w)
    for isa in int8_isas():
        for bf16 in (False, True):
            xin = x.bfloat16() if bf16 else x
            q, scale = quant_gemm.quantize_rows(xin)
            y = quant_gemm.int8_linear_quantized(q, scale, packed, comp, w_scale, b, bf16, isa)
            assert torch.equal(y, quant_gemm.int8_linear(xin, packed, comp, w_scale, b, isa)), f"isa {isa} bf16 {bf16}"
