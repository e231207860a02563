"""Shape, dtype and device checks shared by the Triton kernels and their references.

Only metadata is checked here (no values), so the checks never synchronise with the GPU.
"""

from typing import Callable

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _require(condition: bool, message: Callable[[], str]) -> None:
    # the message is built only on failure: these checks run on every layer of every step
    if not condition:
        raise ValueError(message())


def _check_pool(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, o: torch.Tensor,
                req_to_token: torch.Tensor) -> None:
    _require(q.dim() == 3, lambda: f"q must be [tokens, num_q_heads, head_dim], got shape {tuple(q.shape)}")
    _require(k_buffer.dim() == 3,
             lambda: f"k_buffer must be [num_slots, num_kv_heads, head_dim], got shape {tuple(k_buffer.shape)}")
    _require(v_buffer.shape == k_buffer.shape,
             lambda: f"v_buffer shape {tuple(v_buffer.shape)} != k_buffer shape {tuple(k_buffer.shape)}")
    _require(o.shape == q.shape, lambda: f"o shape {tuple(o.shape)} != q shape {tuple(q.shape)}")
    _require(q.dtype in FLOAT_DTYPES, lambda: f"q dtype {q.dtype} is not one of {FLOAT_DTYPES}")
    _require(k_buffer.dtype == q.dtype and v_buffer.dtype == q.dtype and o.dtype == q.dtype,
             lambda: f"q, o, k_buffer, v_buffer must share one dtype, got {q.dtype}, {o.dtype}, "
             f"{k_buffer.dtype}, {v_buffer.dtype}")
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_buffer.shape[1]
    _require(k_buffer.shape[2] == head_dim,
             lambda: f"head_dim of q ({head_dim}) != head_dim of k_buffer ({k_buffer.shape[2]})")
    _require(num_kv_heads > 0 and num_q_heads % num_kv_heads == 0,
             lambda: f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    _require(req_to_token.dim() == 2 and req_to_token.dtype in INDEX_DTYPES,
             lambda: f"req_to_token must be a 2-D int32/int64 tensor, got {req_to_token.dtype} "
             f"shape {tuple(req_to_token.shape)}")
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer), ("o", o), ("req_to_token", req_to_token)):
        _require(t.device == q.device, lambda: f"{name} is on {t.device} but q is on {q.device}")


def _check_index(name: str, t: torch.Tensor, batch: int, device: torch.device) -> None:
    _require(t.dim() == 1 and t.shape[0] == batch,
             lambda: f"{name} must be a 1-D tensor of length {batch}, got shape {tuple(t.shape)}")
    _require(t.dtype in INDEX_DTYPES, lambda: f"{name} must be int32 or int64, got {t.dtype}")
    _require(t.device == device, lambda: f"{name} is on {t.device} but q is on {device}")


def check_decode_args(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens) -> None:
    _check_pool(q, k_buffer, v_buffer, o, req_to_token)
    batch = q.shape[0]
    _check_index("req_pool_indices", req_pool_indices, batch, q.device)
    _check_index("seq_lens", seq_lens, batch, q.device)


def check_extend_args(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens,
                      qo_start_loc) -> None:
    _check_pool(q, k_buffer, v_buffer, o, req_to_token)
    batch = req_pool_indices.shape[0] if req_pool_indices.dim() == 1 else -1
    for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens),
                    ("extend_lens", extend_lens), ("qo_start_loc", qo_start_loc)):
        _check_index(name, t, batch, q.device)


def check_lengths(seq_lens: list[int], extend_lens: list[int], max_context_len: int) -> None:
    """Value checks, for callers that already hold the lengths on the host (the references)."""
    for b, (seq_len, extend_len) in enumerate(zip(seq_lens, extend_lens)):
        _require(1 <= extend_len <= seq_len,
                 lambda: f"request {b}: need 1 <= extend_len ({extend_len}) <= seq_len ({seq_len})")
        _require(seq_len <= max_context_len,
                 lambda: f"request {b}: seq_len ({seq_len}) exceeds req_to_token width ({max_context_len})")
