"""The paged K/V tile load both attention kernels share: BLOCK_N tokens of one request, one KV head."""

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
