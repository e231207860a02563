"""Paged decode attention (flash-decoding) in Triton.

One query token per request attends to the request's tokens 0..seq_len-1, gathered slot by slot
through req_to_token. The context is cut into num_kv_splits pieces; stage 1 runs one program per
(request, kv head, split) that handles every query head of the kv head's group at once, so each
K/V row is read from memory once; stage 2 merges the splits with their log-sum-exps.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .launch import LOG2_E, dot_operands, interpreting, num_compute_units, padded_head_dim
from .paged_tile import load_kv_tile, online_softmax_update
from .validate import check_decode_args

MIN_TOKENS_PER_SPLIT = 256
MAX_KV_SPLITS = 64


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int = 64  # tokens per inner step
    num_warps: int = 4
    num_stages: int = 2


@triton.jit
def _decode_split_kernel(
    Q, K, V, ReqToToken, ReqPoolIndices, SeqLens, PartialOut, PartialLse,
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    num_kv_splits,
    stride_qb, stride_qh, stride_qd,
    stride_ks, stride_kh, stride_kd,
    stride_vs, stride_vh, stride_vd,
    stride_rr, stride_rp,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    offs_g = tl.arange(0, BLOCK_H)
    mask_g = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    seq_len = tl.load(SeqLens + b).to(tl.int32)
    row = tl.load(ReqPoolIndices + b).to(tl.int64)
    split_len = tl.cdiv(seq_len, num_kv_splits)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n_start in range(start, end, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k, v = load_kv_tile(ReqToToken, K, V, row, kv_head, offs_n, mask_n, offs_d, mask_d,
                            stride_rr, stride_rp, stride_ks, stride_kh, stride_kd, stride_vs, stride_vh,
                            stride_vd, UPCAST)
        m_i, l_i, acc = online_softmax_update(q, k, v, mask_n[None, :], qk_scale, m_i, l_i, acc, DOT_PRECISION)

    # An empty split (a request shorter than num_kv_splits) leaves l_i == 0 and m_i == -inf:
    # it stores zeros with lse = -inf, which the merge weighs by exp2(-inf) = 0.
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out_ptrs = PartialOut + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :]
    tl.store(out_ptrs, acc / l_safe[:, None], mask=mask_g[:, None] & mask_d[None, :])
    tl.store(PartialLse + b * stride_lb + heads * stride_lh + split, m_i + tl.log2(l_safe), mask=mask_g)


@triton.jit
def _decode_merge_kernel(
    PartialOut, PartialLse, Out,
    num_kv_splits,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    stride_ob, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    part_ptrs = PartialOut + b * stride_pb + head * stride_ph + offs_d
    lse_ptr = PartialLse + b * stride_lb + head * stride_lh

    # Split 0 is never empty (seq_len >= 1), so the running max starts finite.
    m = tl.load(lse_ptr)
    denom = tl.exp2(m - m)
    acc = tl.load(part_ptrs, mask=mask_d, other=0.0)
    for split in range(1, num_kv_splits):
        lse = tl.load(lse_ptr + split)
        part = tl.load(part_ptrs + split * stride_ps, mask=mask_d, other=0.0)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp2(m - m_new)
        weight = tl.exp2(lse - m_new)
        acc = acc * alpha + part * weight
        denom = denom * alpha + weight
        m = m_new
    tl.store(Out + b * stride_ob + head * stride_oh + offs_d * stride_od, (acc / denom).to(Out.dtype.element_ty),
             mask=mask_d)


def choose_num_kv_splits(max_seq_len: int, batch: int, num_kv_heads: int, device: torch.device) -> int:
    """Enough splits to give every SM a few programs, but no split shorter than MIN_TOKENS_PER_SPLIT."""
    wanted_programs = 4 * num_compute_units(device)
    by_occupancy = triton.cdiv(wanted_programs, max(1, batch * num_kv_heads))
    by_length = triton.cdiv(max_seq_len, MIN_TOKENS_PER_SPLIT)
    return max(1, min(by_occupancy, by_length, MAX_KV_SPLITS))


def default_decode_config(dtype: torch.dtype) -> DecodeConfig:
    # Chosen from ptxas register counts for sm_90 (benchmarks/kernels_compile.py): no spills.
    if dtype == torch.float32:
        return DecodeConfig(block_n=32, num_warps=8, num_stages=2)
    return DecodeConfig()


def launch_decode(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, sm_scale,
                  num_kv_splits: int, config: DecodeConfig) -> None:
    """decode_attention with every launch choice explicit (the benchmark sweeps config)."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_q_heads // num_kv_heads
    if num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
    if batch == 0:
        return
    block_d = padded_head_dim(head_dim)
    upcast, precision = dot_operands(q.dtype)
    partial_out = torch.empty(batch, num_q_heads, num_kv_splits, head_dim, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(batch, num_q_heads, num_kv_splits, dtype=torch.float32, device=q.device)

    _decode_split_kernel[(batch, num_kv_heads, num_kv_splits)](
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, partial_out, partial_lse,
        sm_scale * LOG2_E, num_kv_splits,
        *q.stride(), *k_buffer.stride(), *v_buffer.stride(), *req_to_token.stride(),
        *partial_out.stride()[:3], *partial_lse.stride()[:2],
        GROUP=group, HEAD_DIM=head_dim, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=config.block_n, BLOCK_D=block_d, UPCAST=upcast, DOT_PRECISION=precision,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    _decode_merge_kernel[(batch, num_q_heads)](
        partial_out, partial_lse, o, num_kv_splits,
        *partial_out.stride()[:3], *partial_lse.stride()[:2], *o.stride(),
        HEAD_DIM=head_dim, BLOCK_D=block_d, num_warps=1 if interpreting() else 2,
    )


def decode_attention(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, sm_scale,
                     num_kv_splits=None) -> None:
    """o[b] = softmax(q[b] K^T * sm_scale) V over tokens 0..seq_lens[b]-1 of request req_pool_indices[b].

    q, o: [B, Hq, D]; k_buffer, v_buffer: [num_slots, Hkv, D] with Hq % Hkv == 0; every seq_lens[b] >= 1.
    num_kv_splits=None picks a split count from the longest sequence (one host sync).
    """
    check_decode_args(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens)
    if q.shape[0] == 0:
        return
    if num_kv_splits is None:
        num_kv_splits = choose_num_kv_splits(int(seq_lens.max()), q.shape[0], k_buffer.shape[1], q.device)
    launch_decode(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, sm_scale,
                  num_kv_splits, default_decode_config(q.dtype))
