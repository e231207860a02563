"""Paged decode/extend attention: the PyTorch references against a naive dense attention, and the
Triton kernels against the references (under TRITON_INTERPRET=1 on the CPU, natively on a GPU).

Error is max |out - ref| / max |ref|. bf16: the interpreter holds bf16 as raw uint16, so on the CPU
the kernels take their upcast-to-fp32 path for bf16 (launch.dot_operands); the native bf16 tensor-core
path is checked on a GPU (here when CUDA is present, and by benchmarks/kernels.py).
"""

import importlib.util

import pytest
import torch

from vlserve.kernels import decode_attention_ref, extend_attention_ref, triton_available
from vlserve.kernels.paged_batch import random_paged_batch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (import triton fails)")

# Tolerances against the reference run on the same inputs (bf16: one bf16 ulp is 2**-7 relative).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def naive_attention(batch) -> torch.Tensor:
    """Dense float64 attention written from the definition, one query row at a time."""
    q, k_pool, v_pool = batch.q.double().cpu(), batch.k_buffer.double().cpu(), batch.v_buffer.double().cpu()
    group = q.shape[1] // k_pool.shape[1]
    out = torch.zeros_like(q)
    table = batch.req_to_token.cpu()
    for row, seq_len, num_new, start in zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist(),
                                            batch.extend_lens.tolist(), batch.qo_start_loc.tolist()):
        for i in range(num_new):
            position = seq_len - num_new + i
            slots = [int(table[row, p]) for p in range(position + 1)]
            for h in range(q.shape[1]):
                keys = torch.stack([k_pool[s, h // group] for s in slots])
                values = torch.stack([v_pool[s, h // group] for s in slots])
                weights = torch.softmax(keys @ q[start + i, h] * batch.sm_scale, dim=0)
                out[start + i, h] = weights @ values
    return out


# ---------------------------------------------------------------------------------- references


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_reference_matches_naive(page_size):
    batch = random_paged_batch([1, 6, 13], None, 4, 2, 16, torch.float32, page_size, seed=page_size)
    assert rel_err(batch.decode(decode_attention_ref), naive_attention(batch)) < 1e-6


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(2, 2), (4, 1)])
def test_extend_reference_matches_naive(num_q_heads, num_kv_heads):
    # Prefix 0 (is_causal path), a middle prefix and a single new token (explicit mask / no mask).
    batch = random_paged_batch([7, 9, 5], [7, 4, 1], num_q_heads, num_kv_heads, 16, torch.float32, 2, seed=3)
    assert rel_err(batch.extend(extend_attention_ref), naive_attention(batch)) < 1e-6


def test_reference_rejects_bad_input():
    batch = random_paged_batch([4, 3], None, 4, 2, 16, torch.float32)
    o = torch.empty_like(batch.q)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        decode_attention_ref(batch.q[:, :3], batch.k_buffer, batch.v_buffer, o[:, :3], batch.req_to_token,
                             batch.req_pool_indices, batch.seq_lens, 1.0)
    with pytest.raises(ValueError, match="seq_lens must be a 1-D tensor of length 2"):
        decode_attention_ref(batch.q, batch.k_buffer, batch.v_buffer, o, batch.req_to_token,
                             batch.req_pool_indices, batch.seq_lens[:1], 1.0)
    with pytest.raises(ValueError, match="share one dtype"):
        decode_attention_ref(batch.q.half(), batch.k_buffer, batch.v_buffer, o.half(), batch.req_to_token,
                             batch.req_pool_indices, batch.seq_lens, 1.0)
    with pytest.raises(ValueError, match="extend_len"):
        extend_attention_ref(batch.q, batch.k_buffer, batch.v_buffer, o, batch.req_to_token,
                             batch.req_pool_indices, batch.seq_lens, batch.seq_lens + 1, batch.qo_start_loc, 1.0)


# ------------------------------------------------------------------------------ triton kernels

# (dtype, Hq, Hkv, head_dim, page_size, num_kv_splits, seq_lens): together every head dim, the
# ratios 1/2/4, page sizes 1 and >1, one split, many splits (some empty) and the automatic choice.
DECODE_CASES = [
    (torch.float32, 4, 4, 64, 1, None, [1, 9, 70, 131]),
    (torch.float32, 4, 2, 80, 16, 3, [5, 64, 100]),
    (torch.float32, 8, 2, 16, 4, 8, [1, 3, 40]),
    (torch.float32, 2, 2, 96, 1, 1, [33, 2]),
    (torch.float32, 4, 1, 128, 8, None, [17, 65]),
    (torch.float32, 2, 1, 32, 1, 4, [1, 129]),
    (torch.float16, 4, 1, 128, 16, 4, [1, 77, 150]),
    (torch.float16, 4, 4, 64, 1, None, [3, 66]),
    (torch.float16, 4, 2, 80, 2, 2, [40, 9]),
    (torch.float16, 2, 2, 32, 1, 5, [12, 1, 90]),
    (torch.bfloat16, 4, 2, 64, 1, 3, [8, 100]),
    (torch.bfloat16, 4, 1, 96, 4, None, [1, 70]),
]


def _case_id(case) -> str:
    dtype, hq, hkv, d, page, *rest = case
    return f"{str(dtype)[6:]}-{hq}q{hkv}kv-d{d}-page{page}"


@needs_triton
@pytest.mark.parametrize("case", DECODE_CASES, ids=_case_id)
def test_decode_kernel_matches_reference(case):
    from vlserve.kernels import decode_attention

    dtype, hq, hkv, d, page_size, splits, seq_lens = case
    batch = random_paged_batch(seq_lens, None, hq, hkv, d, dtype, page_size, DEVICE, seed=len(seq_lens) + d)
    out = batch.decode(decode_attention, splits)
    assert out.dtype == dtype
    assert rel_err(out, batch.decode(decode_attention_ref)) < TOLERANCE[dtype]


# (dtype, Hq, Hkv, head_dim, page_size, seq_lens, extend_lens): prefix 0 (extend_len = seq_len),
# prefix seq_len - 1 (one new token), prefixes in between, and more new tokens than one query block.
EXTEND_CASES = [
    (torch.float32, 4, 4, 64, 1, [70, 9, 30], [70, 1, 17]),
    (torch.float32, 4, 2, 80, 16, [100, 5], [37, 5]),
    (torch.float32, 8, 2, 16, 4, [1, 20, 66], [1, 19, 66]),
    (torch.float32, 2, 2, 96, 1, [40, 3], [1, 2]),
    (torch.float32, 4, 1, 128, 8, [90], [80]),
    (torch.float32, 2, 1, 32, 1, [130, 12], [65, 12]),
    (torch.float16, 4, 1, 128, 16, [75, 33], [70, 1]),
    (torch.float16, 4, 4, 64, 1, [50, 8], [20, 8]),
    (torch.float16, 4, 2, 80, 2, [9, 67], [4, 3]),
    (torch.float16, 2, 2, 32, 1, [100], [100]),
    (torch.bfloat16, 4, 2, 64, 1, [40, 17], [13, 17]),
    (torch.bfloat16, 4, 1, 96, 4, [66, 1], [2, 1]),
]


@needs_triton
@pytest.mark.parametrize("case", EXTEND_CASES, ids=_case_id)
def test_extend_kernel_matches_reference(case):
    from vlserve.kernels import extend_attention

    dtype, hq, hkv, d, page_size, seq_lens, extend_lens = case
    batch = random_paged_batch(seq_lens, extend_lens, hq, hkv, d, dtype, page_size, DEVICE, seed=len(seq_lens) + d)
    out = batch.extend(extend_attention)
    assert out.dtype == dtype
    assert rel_err(out, batch.extend(extend_attention_ref)) < TOLERANCE[dtype]


@needs_triton
def test_kernels_accept_int64_lengths_and_strided_q():
    from vlserve.kernels import decode_attention, extend_attention

    batch = random_paged_batch([12, 30], [12, 5], 4, 2, 32, torch.float32, 1, DEVICE, index_dtype=torch.int64)
    # q as a view into a fused qkv projection: rows are strided, heads contiguous.
    qkv = torch.randn(batch.q.shape[0], 8, 32, device=DEVICE)
    batch.q = qkv[:, 2:6]
    assert rel_err(batch.extend(extend_attention), batch.extend(extend_attention_ref)) < 1e-5

    decode_batch = random_paged_batch([12, 30], None, 4, 2, 32, torch.float32, 1, DEVICE, index_dtype=torch.int64)
    assert rel_err(decode_batch.decode(decode_attention), decode_batch.decode(decode_attention_ref)) < 1e-5


@needs_triton
def test_kernels_reject_bad_input_and_report_availability():
    from vlserve.kernels import decode_attention

    assert triton_available()
    batch = random_paged_batch([4], None, 4, 2, 16, torch.float32, device=DEVICE)
    o = torch.empty_like(batch.q)
    with pytest.raises(ValueError, match="head_dim of q"):
        decode_attention(batch.q[..., :8], batch.k_buffer, batch.v_buffer, o[..., :8], batch.req_to_token,
                         batch.req_pool_indices, batch.seq_lens, 1.0)
    with pytest.raises(ValueError, match="num_kv_splits"):
        decode_attention(batch.q, batch.k_buffer, batch.v_buffer, o, batch.req_to_token,
                         batch.req_pool_indices, batch.seq_lens, 1.0, num_kv_splits=0)


@needs_triton
def test_package_names_stay_bound_to_the_kernels():
    import types

    import vlserve.kernels as kernels
    from vlserve.kernels.decode_attention import choose_num_kv_splits, launch_decode  # noqa: F401

    # Importing the submodule must not rebind vlserve.kernels.decode_attention to the module.
    assert isinstance(kernels.decode_attention, types.FunctionType)
    assert kernels.decode_attention.__module__.endswith("decode_attention")
    assert choose_num_kv_splits(5, 1, 1, torch.device("cpu")) == 1  # short: one split
    assert choose_num_kv_splits(4096, 1, 1, torch.device("cpu")) == 4  # limited by programs wanted
    assert 1 <= choose_num_kv_splits(10**6, 1, 1, torch.device("cpu")) <= 64


def test_paged_batch_layout():
    batch = random_paged_batch([9, 4, 6], [3, 4, 1], 2, 1, 16, torch.float32, page_size=4, seed=5)
    table, seen = batch.req_to_token, set()
    for row, seq_len in zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
        slots = table[row, :seq_len].tolist()
        # page-aligned runs: position p sits at offset p % 4 of its page
        assert all(slot % 4 == p % 4 for p, slot in enumerate(slots))
        assert all(slots[p] - slots[p - 1] == 1 for p in range(1, seq_len) if p % 4)
        assert not seen & set(slots)
        seen |= set(slots)
    assert batch.qo_start_loc.tolist() == [0, 3, 7] and batch.q.shape == (8, 2, 16)
