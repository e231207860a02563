"""What both attention kernels share per tile: the paged K/V load (BLOCK_N tokens of one request, one
KV head) and the online-softmax update that folds the tile into the running output."""

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(ReqToToken, K, V, row, kv_head, offs_n, mask_n, offs_d, mask_d,
                 stride_rr, stride_rp, stride_ks, stride_kh, stride_kd, stride_vs, stride_vh, stride_vd,
                 UPCAST: tl.constexpr):
    """K and V [BLOCK_N, BLOCK_D] of positions offs_n, gathered through req_to_token (0 where masked)."""
    # int64 before the multiply: slot * stride overflows int32 in a large pool.
    slots = tl.load(ReqToToken + row * stride_rr + offs_n * stride_rp, mask=mask_n, other=0).to(tl.int64)
    mask_nd = mask_n[:, None] & mask_d[None, :]
    k = tl.load(K + slots[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :] * stride_kd,
                mask=mask_nd, other=0.0)
    v = tl.load(V + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :] * stride_vd,
                mask=mask_nd, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def online_softmax_update(q, k, v, visible, qk_scale, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
    """Flash attention over one tile, in base 2: the scores of the visible keys fold into the running
    row max m_i, normaliser l_i and unnormalised output acc, which are returned updated."""
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc
