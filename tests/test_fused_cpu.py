"""The fused elementwise kernels (kernels/csrc/fused_cpu.cpp) against the eager PyTorch they replace,
written out here as transformers writes them: fp32 to rounding, bf16/fp16 to one unit in the last
place (the same rounding steps; only exp and the sum order differ). Widths that are not a multiple of
the vector width, one row and many, strided views of a fused qkv output, and two threads."""

import pytest
import torch

from vlserve.kernels.cpu_attention import cpu_attention_error, cpu_attention_op
from vlserve.kernels.fused import fused_op

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def op():
    assert cpu_attention_op() is not None, f"the CPU kernels did not build: {cpu_attention_error()}"
    return fused_op(torch.zeros(1))


def _close(got, want):
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # one unit in the last place of the dtype, relative
        ulp = torch.finfo(want.dtype).eps
        torch.testing.assert_close(got.float(), want.float(), rtol=ulp, atol=ulp)


def _rms_norm_ref(x, w, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _rotary_ref(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", [(1, 64), (3, 100), (37, 1024), (300, 13)])
def test_rms_norm_and_add_rms_norm(op, dtype, rows, width, threads):
    g = torch.Generator().manual_seed(rows * width)
    x = (torch.randn(rows, width, generator=g) * 3).to(dtype)
    a = torch.randn(rows, width, generator=g).to(dtype)
    w = (1 + torch.randn(width, generator=g) / 4).to(dtype)
    _close(op.rms_norm(x, w, 1e-5), _rms_norm_ref(x, w, 1e-5))
    total, normed = op.add_rms_norm(x, a, w, 1e-6)
    assert torch.equal(total, x + a)
    _close(normed, _rms_norm_ref(x + a, w, 1e-6))
    wide = torch.randn(rows, width + 7, generator=g).to(dtype)[:, :width]  # rows with a stride
    _close(op.rms_norm(wide, w, 1e-5), _rms_norm_ref(wide, w, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
# 100: four vectors at a time (kSiluVectors), then two single vectors, then a scalar tail
@pytest.mark.parametrize("rows,inner", [(1, 8), (5, 19), (3, 100), (64, 2816)])
def test_silu_mul(op, dtype, rows, inner, threads):
    g = torch.Generator().manual_seed(inner)
    gate_up = (torch.randn(rows, 2 * inner, generator=g) * 4).to(dtype)
    gate_up[0, 0], gate_up[-1, 1] = 95.0, -95.0  # exp's clamped range
    gate, up = gate_up.chunk(2, dim=-1)
    _close(op.silu_mul(gate_up), torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,heads,kv_heads,dim", [(1, 4, 2, 64), (9, 16, 4, 64), (40, 6, 2, 32), (5, 4, 2, 36)])
def test_rotary_in_place_on_views_of_a_fused_qkv(op, dtype, rows, heads, kv_heads, dim, threads):
    g = torch.Generator().manual_seed(rows + heads)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    angles = torch.rand(rows, dim // 2, generator=g) * 50
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.reshape(rows, heads, dim), k.reshape(rows, kv_heads, dim)
    want_q, want_k, want_v = _rotary_ref(q, cos, sin), _rotary_ref(k, cos, sin), v.clone()
    op.rotary_(q, cos, sin)
    op.rotary_(k, cos, sin)
    _close(q, want_q)
    _close(k, want_k)
    if dtype == torch.bfloat16:  # the same rounding steps as eager bf16, vector lanes and tail alike
        assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(v, want_v), "the rotation wrote outside q and k"


def test_bad_shapes_are_refused(op):
    with pytest.raises(RuntimeError, match="last dimension must be even"):
        op.silu_mul(torch.zeros(2, 5))
    with pytest.raises(RuntimeError, match="weight must be"):
        op.rms_norm(torch.zeros(2, 8), torch.zeros(4), 1e-5)
    with pytest.raises(RuntimeError, match="cos and sin"):
        op.rotary_(torch.zeros(2, 1, 8), torch.zeros(3, 8), torch.zeros(3, 8))


def test_bf16_silu_mul_vector_lanes_round_as_the_scalar_tail(op):
    """The bf16 vector path (whole vectors of a row) rounds exactly as the per-element tail does:
    the same row computed as one wide row and as single-element rows is bit-identical, NaN included."""
    g = torch.Generator().manual_seed(7)
    gate, up = torch.randn(1, 301, generator=g) * 6, torch.randn(1, 301, generator=g) * 3
    gate[0, 5], gate[0, 40], up[0, 77] = float("nan"), 95.0, float("inf")
    wide = op.silu_mul(torch.cat([gate, up], -1).bfloat16())
    single = torch.cat([op.silu_mul(torch.stack([gate[0, i], up[0, i]]).view(1, 2).bfloat16()) for i in range(301)], -1)
    assert torch.equal(wide.view(torch.int16), single.view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 24, 450])
def test_store_kv_writes_exactly_the_slots_index_copy_writes(op, dtype, tokens, threads):
    """K and V as views of a fused qkv output (rows strided, heads contiguous) and V with its heads
    strided too, written at scattered slots: the pools equal index_copy_'s, and no other slot moves."""
    g = torch.Generator().manual_seed(tokens)
    slots_total, heads, dim = 2048, 4, 64
    slots = torch.randperm(slots_total, generator=g)[:tokens].to(torch.int32)
    qkv = torch.randn(tokens, 1024 + 2 * heads * dim, generator=g).to(dtype)
    k = qkv[:, 1024:1024 + heads * dim].view(tokens, heads, dim)
    v = torch.randn(tokens, heads, 2 * dim, generator=g).to(dtype)[:, :, :dim]  # heads strided by 2 * dim
    k_buf, v_buf = (torch.randn(slots_total, heads, dim, generator=g).to(dtype) for _ in range(2))
    want_k, want_v = k_buf.clone().index_copy_(0, slots.long(), k), v_buf.clone().index_copy_(0, slots.long(), v)
    op.store_kv(k_buf, v_buf, slots, k, v)
    assert torch.equal(k_buf, want_k) and torch.equal(v_buf, want_v)


def test_store_kv_refuses_slots_outside_the_pool_and_bad_shapes(op):
    k_buf, v_buf = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
    kv = torch.ones(2, 2, 4)
    for bad in ([0, 8], [-1, 3]):
        with pytest.raises(RuntimeError, match="outside the pool of 8 slots"):
            op.store_kv(k_buf, v_buf, torch.tensor(bad), kv, kv)
    assert not k_buf.any() and not v_buf.any(), "a refused store wrote"
    with pytest.raises(RuntimeError, match="K and V must be"):
        op.store_kv(k_buf, v_buf, torch.tensor([0, 1]), torch.ones(2, 3, 4), kv)
    with pytest.raises(RuntimeError, match="one dtype"):
        op.store_kv(k_buf, v_buf, torch.tensor([0, 1]), kv.double(), kv)


def test_kv_pool_write_takes_the_fused_store_and_matches_its_fallback(op):
    """KVPool.write on a CPU pool: through store_kv, int32 slots, K and V widened or narrowed to the
    pool's dtype first; the pool equals what the index_copy_ fallback writes."""
    from vlserve.memory import kv_pool

    assert kv_pool.fused_op(torch.zeros(1)) is op, "a CPU pool's writes would not take store_kv"
    g = torch.Generator().manual_seed(3)
    slots = torch.randperm(64, generator=g)[:9].to(torch.int32)
    k, v = torch.randn(9, 2, 16, generator=g), torch.randn(9, 2, 16, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        fused, fallback = (kv_pool.KVPool.create(2, 64, 2, 16, dtype) for _ in range(2))
        for pool in (fused, fallback):
            for buf in pool.k_buffers + pool.v_buffers:
                buf.zero_()
        fused.write(1, slots, k, v)
        fallback.write(1, slots, k, v, fused=False)
        for a, b in zip(fused.k_buffers + fused.v_buffers, fallback.k_buffers + fallback.v_buffers):
            assert torch.equal(a, b)
        assert torch.equal(fused.k_buffers[1][slots.long()], k.to(dtype))
