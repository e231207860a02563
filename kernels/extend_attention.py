"""Paged extend (prefill) attention in Triton: new tokens over a cached prefix plus themselves.

Request b has seq_lens[b] tokens in the pool, of which the last extend_lens[b] are new (their K/V
already written). Its new queries are rows qo_start_loc[b]... of q; new token i sits at position
prefix + i and attends to keys 0..prefix + i. One program per (request, query head, block of
BLOCK_M new tokens) walks the keys once through req_to_token: a cached prefix costs only reads.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .launch import LOG2_E, dot_operands, padded_head_dim
from .paged_tile import load_kv_tile, online_softmax_update
from .validate import check_extend_args


@dataclass(frozen=True)
class ExtendConfig:
    block_m: int = 64  # new tokens per program
    block_n: int = 64  # keys per inner step
    num_warps: int = 4
    num_stages: int = 2


@triton.jit
def _extend_kernel(
    Q, K, V, Out, ReqToToken, ReqPoolIndices, SeqLens, ExtendLens, QoStartLoc,
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    stride_qt, stride_qh, stride_qd,
    stride_ks, stride_kh, stride_kd,
    stride_vs, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od,
    stride_rr, stride_rp,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    kv_head = head // GROUP

    seq_len = tl.load(SeqLens + b).to(tl.int32)
    extend_len = tl.load(ExtendLens + b).to(tl.int32)
    q_start = tl.load(QoStartLoc + b).to(tl.int64)
    row = tl.load(ReqPoolIndices + b).to(tl.int64)
    prefix_len = seq_len - extend_len

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < extend_len
    # Rows past extend_len get positions >= seq_len: they see every key, so they never make NaNs.
    q_pos = prefix_len + offs_m
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_md = mask_m[:, None] & mask_d[None, :]

    q_rows = q_start + offs_m
    q = tl.load(Q + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :] * stride_qd,
                mask=mask_md, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    # Keys up to the block's last query position; a block wholly past extend_len (the grid is
    # sized for the longest request) does no work at all.
    key_end = tl.minimum(seq_len, prefix_len + (m_block + 1) * BLOCK_M)
    key_end = tl.where(m_block * BLOCK_M < extend_len, key_end, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n_start in range(0, key_end, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < key_end
        k, v = load_kv_tile(ReqToToken, K, V, row, kv_head, offs_n, mask_n, offs_d, mask_d,
                            stride_rr, stride_rp, stride_ks, stride_kh, stride_kd, stride_vs, stride_vh,
                            stride_vd, UPCAST)

        visible = (offs_n[None, :] <= q_pos[:, None]) & mask_n[None, :]
        m_i, l_i, acc = online_softmax_update(q, k, v, visible, qk_scale, m_i, l_i, acc, DOT_PRECISION)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = (acc / l_safe[:, None]).to(Out.dtype.element_ty)
    tl.store(Out + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :] * stride_od, out, mask=mask_md)


def default_extend_config(dtype: torch.dtype) -> ExtendConfig:
    # Chosen from ptxas register counts for sm_90 (benchmarks/kernels_compile.py): no spills.
    if dtype == torch.float32:
        return ExtendConfig(block_m=32, block_n=32, num_warps=8, num_stages=2)
    return ExtendConfig()


def launch_extend(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens,
                  qo_start_loc, sm_scale, max_extend_len: int, config: ExtendConfig) -> None:
    """extend_attention with every launch choice explicit (the benchmark sweeps config)."""
    batch = req_pool_indices.shape[0]
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_buffer.shape[1]
    if batch == 0 or max_extend_len <= 0:
        return
    upcast, precision = dot_operands(q.dtype)
    grid = (batch, num_q_heads, triton.cdiv(max_extend_len, config.block_m))
    _extend_kernel[grid](
        q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens, qo_start_loc,
        sm_scale * LOG2_E,
        *q.stride(), *k_buffer.stride(), *v_buffer.stride(), *o.stride(), *req_to_token.stride(),
        GROUP=num_q_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_D=padded_head_dim(head_dim), UPCAST=upcast, DOT_PRECISION=precision,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def extend_attention(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens,
                     qo_start_loc, sm_scale) -> None:
    """Request b's new tokens q[qo_start_loc[b] : qo_start_loc[b] + extend_lens[b]] attend to its
    cached prefix (seq_lens[b] - extend_lens[b] tokens) and causally to themselves.

    q, o: [T, Hq, D]; k_buffer, v_buffer: [num_slots, Hkv, D]; 1 <= extend_lens[b] <= seq_lens[b].
    Sizing the grid reads max(extend_lens) on the host (one sync).
    """
    check_extend_args(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens,
                      qo_start_loc)
    if req_pool_indices.shape[0] == 0:
        return
    launch_extend(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens,
                  qo_start_loc, sm_scale, int(extend_lens.max()), default_extend_config(q.dtype))
