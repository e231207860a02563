"""PyTorch references for paged decode and extend attention (the default backend on the CPU).

Same signatures as the Triton kernels. Each request's KV is gathered through req_to_token and
attended with one scaled_dot_product_attention call, in fp32; the result is cast to q's dtype.
"""

import torch
import torch.nn.functional as F

from .validate import check_decode_args, check_extend_args, check_lengths


def _gather_kv(k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor, row: int,
               length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, num_kv_heads, length, head_dim] fp32 K and V of request row's tokens 0..length-1."""
    slots = req_to_token[row, :length].long()
    k = k_buffer[slots].transpose(0, 1).unsqueeze(0).float()
    v = v_buffer[slots].transpose(0, 1).unsqueeze(0).float()
    return k, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, sm_scale: float,
            causal: bool = True) -> torch.Tensor:
    """q: [num_new, Hq, D] at positions prefix_len.. ; k, v: [1, Hkv, prefix_len + num_new, D].
    causal=False: every query sees every key."""
    num_new = q.shape[0]
    qh = q.transpose(0, 1).unsqueeze(0).float()
    if not causal:
        out = F.scaled_dot_product_attention(qh, k, v, scale=sm_scale, enable_gqa=True)
    elif num_new == 1 or prefix_len == 0:
        # One query sees every key; with no prefix the mask is SDPA's top-left causal mask.
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=num_new > 1, scale=sm_scale, enable_gqa=True)
    else:
        # Query i sits at position prefix_len + i and sees keys 0..prefix_len + i.
        mask = torch.ones(num_new, k.shape[2], dtype=torch.bool, device=q.device).tril(diagonal=prefix_len)
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=sm_scale, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)


def decode_attention_ref(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, sm_scale,
                         num_kv_splits=None) -> None:
    """o[b] = attention of q[b] over tokens 0..seq_lens[b]-1 of request req_pool_indices[b].

    num_kv_splits is accepted for signature parity with the Triton kernel and ignored.
    """
    check_decode_args(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens)
    rows, lengths = req_pool_indices.tolist(), seq_lens.tolist()
    check_lengths(lengths, [1] * len(lengths), req_to_token.shape[1])
    for b, (row, length) in enumerate(zip(rows, lengths)):
        k, v = _gather_kv(k_buffer, v_buffer, req_to_token, row, length)
        o[b] = _attend(q[b:b + 1], k, v, length - 1, sm_scale)[0].to(o.dtype)


def extend_attention_ref(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens,
                         qo_start_loc, sm_scale, causal: bool = True) -> None:
    """Request b's new tokens q[qo_start_loc[b] : qo_start_loc[b] + extend_lens[b]] attend to its
    cached prefix (positions 0..seq_lens[b]-extend_lens[b]-1) and causally to themselves (causal=False:
    to all of its keys)."""
    check_extend_args(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens,
                      qo_start_loc)
    rows, lengths = req_pool_indices.tolist(), seq_lens.tolist()
    new_counts, starts = extend_lens.tolist(), qo_start_loc.tolist()
    check_lengths(lengths, new_counts, req_to_token.shape[1])
    for b, (row, length, num_new, start) in enumerate(zip(rows, lengths, new_counts, starts)):
        if not 0 <= start <= start + num_new <= q.shape[0]:
            raise ValueError(f"request {b}: rows {start}:{start + num_new} fall outside q's {q.shape[0]} rows")
        k, v = _gather_kv(k_buffer, v_buffer, req_to_token, row, length)
        out = _attend(q[start:start + num_new], k, v, length - num_new, sm_scale, causal)
        o[start:start + num_new] = out.to(o.dtype)
