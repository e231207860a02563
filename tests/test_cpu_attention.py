"""The batched CPU paged-attention kernel (kernels/cpu_attention.py, csrc/paged_attention_cpu.cpp)
against the per-request PyTorch references: ragged lengths, prefix hits, page sizes 1 and > 1,
GQA and MHA, head dims with and without a specialised path, fp32 / bf16 / fp16, one and two threads,
and decode batches whose requests share prefix slots (the shared-prefix pass and its grouping);
bf16 pools' long blocks in bf16 dot products (AVX512_BF16) against the reference and the fp32 path.

Error is max |out - ref| / max |ref|, as in test_kernels.py.
"""

import warnings
from collections import Counter

import pytest
import torch

from vlserve.kernels import cpu_attention
from vlserve.kernels.cpu_attention import (
    cpu_attention_op, decode_attention_cpu, extend_attention_cpu, has_amx, has_bf16_dot, shared_prefix_groups,
)
from vlserve.kernels.paged_batch import random_paged_batch, share_prefixes
from vlserve.kernels.reference import decode_attention_ref, extend_attention_ref

# fp32: both accumulate in fp32 (the kernel's exp is a polynomial, ~1e-7 relative). Low precision:
# both compute in fp32 from the same inputs and round once at the end, so about one output ulp.
TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def l2_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.fixture(scope="module", autouse=True)
def built_kernel():
    op = cpu_attention_op()
    assert op is not None, f"the CPU attention kernel did not build: {cpu_attention.cpu_attention_error()}"


# Lengths cross the kernel's 32-key tiles, 16-token query blocks and (300) the decode path's
# 256-key chunks and 16-key score vectors, and include a 1-token request.
DECODE_LENS = [1, 31, 32, 33, 100, 7, 300]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (6, 1), (16, 2)], ids=["gqa4", "mha", "mqa6", "gqa8"])
# 32, 64, 128: the decode path's vector counts (AVX-512); 40 and 20 (not a whole number of vectors)
# the register-blocked tiles and the scalar path
@pytest.mark.parametrize("head_dim", [64, 128, 32, 40, 20])
def test_decode_matches_reference(page_size, heads, head_dim, threads):
    batch = random_paged_batch(DECODE_LENS, None, *heads, head_dim, torch.float32, page_size, seed=head_dim)
    out = batch.decode(decode_attention_cpu)
    assert rel_err(out, batch.decode(decode_attention_ref)) < TOLERANCE[torch.float32]


# (seq_lens, extend_lens): no prefix, prefix hits of every size, one new token beside a long prompt,
# extends that span several query blocks and key tiles; the last case takes the long-block path
# (128-token query blocks, 512-key blocks, 32-row tiles: fp32 register tiles on AVX-512, BLAS
# elsewhere or for head dims not a multiple of 16) across several key blocks, with the causal edge
# inside the second and third, beside a request short enough for the register-blocked path.
EXTEND_CASES = [
    ([40, 70, 5, 33], [40, 17, 1, 33]),
    ([129, 64, 18], [3, 64, 17]),
    ([1, 2, 200], [1, 1, 150]),
    ([1100, 530, 700], [600, 530, 3]),
]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)], ids=["gqa4", "mha"])
# 72 and 24: the long-block tiles' partial last vector (under a lane mask)
@pytest.mark.parametrize("head_dim", [64, 128, 72, 24])
@pytest.mark.parametrize("case", range(len(EXTEND_CASES)))
def test_extend_matches_reference(page_size, heads, head_dim, case, threads):
    seq_lens, extend_lens = EXTEND_CASES[case]
    batch = random_paged_batch(seq_lens, extend_lens, *heads, head_dim, torch.float32, page_size, seed=case)
    out = batch.extend(extend_attention_cpu)
    assert rel_err(out, batch.extend(extend_attention_ref)) < TOLERANCE[torch.float32]


# causal=False (a vision tower's images, each a request with all its tokens new; vision_attention.py):
# every token sees all of its request's keys, on the short-row path, the long-block path across a
# 512-key block edge, and (bf16) the dot-product path; a cached prefix is seen whole as well.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa4"])
@pytest.mark.parametrize("head_dim", [64, 72, 24])
def test_non_causal_extend_matches_reference(dtype, heads, head_dim, threads):
    seq_lens, extend_lens = [257, 257, 6, 600, 90], [257, 257, 6, 600, 40]
    batch = random_paged_batch(seq_lens, extend_lens, *heads, head_dim, dtype, page_size=1, seed=head_dim)
    ref = batch.extend(lambda *a: extend_attention_ref(*a, causal=False))
    out = batch.extend(lambda *a: extend_attention_cpu(*a, causal=False))
    assert rel_err(out, ref) < TOLERANCE[dtype]
    if dtype == torch.bfloat16:
        assert l2_err(out, ref) < 4e-3
    # and it is not the causal result: the first token of a request sees more than itself
    assert rel_err(batch.extend(extend_attention_ref), ref) > 0.1


# A vision tower's own sizes (vision_attention.py: each picture or frame one request, all its tokens
# new, causal=False): SigLIP-so400m's 729 tokens x 16 heads of 72, one picture and a clip of 4
# frames; CLIP-L/14-336's 577 tokens x 16 heads of 64. The pool's slots past the requests' hold NaN,
# so a partial vector read whole past the last row's end would show.
TOWER_SIZES = [([729], 72), ([729] * 4, 72), ([577, 577], 64)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(TOWER_SIZES)), ids=["siglip-picture", "siglip-frames", "clip-pictures"])
def test_tower_sizes_match_reference(dtype, case, threads):
    lens, head_dim = TOWER_SIZES[case]
    torch.manual_seed(case)
    tokens = sum(lens)
    q, k, v = (torch.randn(tokens, 16, head_dim).to(dtype) for _ in range(3))
    k_pool, v_pool = (torch.full((tokens + 8, 16, head_dim), float("nan"), dtype=dtype) for _ in range(2))
    k_pool[:tokens], v_pool[:tokens] = k, v
    starts = torch.tensor([0] + lens[:-1]).cumsum(0)
    table = torch.stack([torch.arange(lens[0], dtype=torch.int32) + int(s) for s in starts])
    rows, seq_lens = torch.arange(len(lens)), torch.tensor(lens)
    out, ref = torch.empty_like(q), torch.empty_like(q)
    args = (table, rows, seq_lens, seq_lens, starts, head_dim ** -0.5)
    extend_attention_cpu(q, k_pool, v_pool, out, *args, causal=False)
    extend_attention_ref(q, k_pool, v_pool, ref, *args, causal=False)
    assert torch.isfinite(out).all()
    # fp32: rows of 577-729 keys; the two sides' sums of that many products differ by up to ~2.3e-6
    # of the output's max (the reference is itself ~1.1e-6 from an fp64 result, measured)
    assert rel_err(out, ref) < (4e-6 if dtype == torch.float32 else TOLERANCE[dtype])
    if dtype == torch.bfloat16:
        assert l2_err(out, ref) < 4e-3


# Decode batches whose requests share leading slots, as the radix cache hands them out: a group of
# 40 (split in two, over the 32-member cap), a pair sharing all but its own new token, a group of 6
# whose prefix ends mid key-tile, a subgroup sharing more inside a group sharing less (the pass
# takes one level: the deeper one saves more here), a pair under the 32-key minimum (no pass), and
# requests with no partner.
def shared_decode_batch(heads, head_dim, dtype, page_size, seed):
    lens = [300] * 40 + [97, 97] + [150, 161, 170, 150, 155, 190] + [260, 262, 264, 266] + [40, 45] + [33, 500]
    batch = random_paged_batch(lens, None, *heads, head_dim, dtype, page_size, seed=seed)
    groups = [(list(range(40)), 257), ([40, 41], 96), (list(range(42, 48)), 141), ([48, 49, 50, 51], 60),
              ([48, 49], 250), ([52, 53], 30)]
    return share_prefixes(batch, groups)


def test_shared_prefix_groups_are_found_and_split():
    batch = shared_decode_batch((8, 2), 64, torch.float32, 1, seed=0)
    plan = shared_prefix_groups(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    group, keys = plan[:, 0].tolist(), plan[:, 1].tolist()
    assert keys[:40] == [257] * 40  # 40 members over the cap of 32: two groups of 20
    assert sorted(Counter(group[:40]).values()) == [20, 20] and -1 not in group[:40]
    assert keys[40:42] == [96, 96] and group[40] == group[41] != -1
    assert keys[42:48] == [141] * 6 and len(set(group[42:48])) == 1
    # 48-51 share 60 keys, 48-49 share 250: a pair at 250 saves more than four at 60
    assert keys[48:50] == [250, 250] and group[48] == group[49] != group[50]
    assert keys[50:52] == [60, 60] and group[50] == group[51] != -1
    assert group[52:] == [-1] * 4 and keys[52:] == [0] * 4  # under 32 shared keys; no partner
    assert len({g for g in group if g >= 0}) == 6


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (6, 1)], ids=["gqa4", "mha", "mqa6"])
@pytest.mark.parametrize("head_dim", [64, 20])
def test_shared_prefix_decode_matches_reference(page_size, heads, head_dim, threads):
    # gqa4: 80 rows a kv head in a 20-member group (the BLAS path), 24 in the group of 6 (BLAS from
    # 16 rows in the shared pass), 8 in a pair (register-blocked); head_dim 20: the scalar path.
    batch = shared_decode_batch(heads, head_dim, torch.float32, page_size, seed=head_dim)
    ref = batch.decode(decode_attention_ref)
    shared = batch.decode(decode_attention_cpu)
    unshared = batch.decode(lambda *a: decode_attention_cpu(*a, share_prefixes=False))
    assert rel_err(shared, ref) < TOLERANCE[torch.float32]
    assert rel_err(unshared, ref) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_shared_prefix_decode_low_precision(dtype):
    batch = shared_decode_batch((8, 2), 64, dtype, 4, seed=5)
    assert rel_err(batch.decode(decode_attention_cpu), batch.decode(decode_attention_ref)) < TOLERANCE[dtype]


def test_shared_prefix_pass_reads_only_the_shared_slots():
    # Poison every slot no request reads: the shared pass must take keys 0..shared-1 from the
    # group's common slots and each member's own slots after them, nothing else.
    batch = shared_decode_batch((8, 2), 64, torch.float32, 1, seed=3)
    used = set()
    for row, length in zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
        used.update(batch.req_to_token[row, :length].tolist())
    unused = torch.tensor(sorted(set(range(batch.k_buffer.shape[0])) - used), dtype=torch.long)
    assert unused.numel() > 1000  # the members' own prefix slots, no longer in any table
    batch.k_buffer[unused] = float("nan")
    batch.v_buffer[unused] = float("nan")
    out = batch.decode(decode_attention_cpu)
    assert torch.isfinite(out).all()
    assert rel_err(out, batch.decode(decode_attention_ref)) < TOLERANCE[torch.float32]


def test_scratch_kept_across_calls_never_leaks_into_a_result(threads):
    # Each thread keeps its scratch buffers from call to call. Big problems with huge scores (q x 300)
    # leave running maxima of thousands and large sums behind; smaller problems of other shapes must
    # then match the reference as they do on fresh buffers (a running max or sum not reset would
    # underflow every exp to 0 and give NaN).
    sequence = [
        ((EXTEND_CASES[3][0], EXTEND_CASES[3][1]), (16, 2), 128),  # the BLAS path, the widest scratch
        ((EXTEND_CASES[0][0], EXTEND_CASES[0][1]), (16, 2), 128),  # the register-blocked path
        ((DECODE_LENS, None), (8, 2), 64),
        ((EXTEND_CASES[0][0], EXTEND_CASES[0][1]), (4, 4), 24),
        ((EXTEND_CASES[1][0], EXTEND_CASES[1][1]), (8, 2), 64),
        (([3, 9], None), (6, 1), 20),
    ]
    for n, ((seq_lens, extend_lens), heads, head_dim) in enumerate(sequence):
        batch = random_paged_batch(seq_lens, extend_lens, *heads, head_dim, torch.float32, 1, seed=head_dim)
        if n < 2:
            batch.q.mul_(300.0)
        if extend_lens is None:
            out, ref = batch.decode(decode_attention_cpu), batch.decode(decode_attention_ref)
        else:
            out, ref = batch.extend(extend_attention_cpu), batch.extend(extend_attention_ref)
        # scores in the thousands round in fp32 to ~1e-4 relative; the later problems are held as tight
        # as on fresh buffers
        assert rel_err(out, ref) < (1e-3 if n < 2 else TOLERANCE[torch.float32]), (seq_lens, heads, head_dim)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_matches_reference(dtype):
    batch = random_paged_batch([50, 9, 120], [50, 3, 1], 8, 2, 64, dtype, page_size=8, seed=7)
    out = batch.extend(extend_attention_cpu)
    assert out.dtype == dtype
    assert rel_err(out, batch.extend(extend_attention_ref)) < TOLERANCE[dtype]
    decode = random_paged_batch([50, 9, 120], None, 8, 2, 64, dtype, page_size=8, seed=8)
    assert rel_err(decode.decode(decode_attention_cpu), decode.decode(decode_attention_ref)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_q_read_in_place_from_fused_qkv_rows(dtype, threads):
    # A layer's q is the leading columns of its fused qkv rows (a view, one token's heads contiguous):
    # the kernel reads it with its row stride, the same bits as from a contiguous copy.
    for extend_lens in (None, [40, 1, 9]):
        batch = random_paged_batch([40, 33, 120], extend_lens, 8, 2, 64, dtype, page_size=1, seed=3)
        tokens, heads, d = batch.q.shape
        qkv = torch.full((tokens, (heads + 4) * d), float("nan"), dtype=dtype)
        qkv[:, :heads * d] = batch.q.reshape(tokens, -1)
        q_view = qkv[:, :heads * d].view(tokens, heads, d)
        assert not q_view.is_contiguous()
        out, out_view = torch.empty_like(batch.q), torch.empty_like(batch.q)
        args = (batch.k_buffer, batch.v_buffer)
        rest = (batch.req_to_token, batch.req_pool_indices, batch.seq_lens, batch.extend_lens, batch.qo_start_loc,
                batch.sm_scale)
        extend_attention_cpu(batch.q, *args, out, *rest)
        extend_attention_cpu(q_view, *args, out_view, *rest, validate=False)
        assert torch.isfinite(out_view).all()
        assert torch.equal(out_view, out)


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())


def cpu_has_avx512_bf16() -> bool:
    return "avx512_bf16" in cpu_flags()


def test_bf16_dot_path_is_built_where_the_cpu_has_it():
    # Built with -march=native: on a CPU with AVX512_BF16 the bf16 path must be there (else every
    # bf16 test below would only test the fp32 BLAS path twice).
    assert has_bf16_dot() == cpu_has_avx512_bf16()


def test_amx_path_is_built_where_the_cpu_has_it():
    # Likewise the AMX tiles on a CPU whose flags (listed by Linux only where it grants the tile
    # state) say AMX-BF16: without them the tests below would compare vdpbf16ps with itself.
    assert has_amx() == ({"amx_bf16", "amx_tile"} <= cpu_flags() and cpu_has_avx512_bf16())


# 72, 24: a partial last vector; 20 (not a multiple of 8): the fp32 BLAS path
@pytest.mark.parametrize("head_dim", [64, 128, 48, 72, 24, 20])
def test_bf16_dot_long_extend_matches_reference(head_dim, threads):
    # EXTEND_CASES[3]: several 512-key blocks, the causal edge inside them, a 3-token request beside.
    # The bf16 path rounds the probabilities to bf16 for P V: the output moves by about one bf16
    # rounding (L2 error ~2e-3 of the output's norm, measured), where the fp32 path rounds exactly as
    # the reference does (~3e-5).
    seq_lens, extend_lens = EXTEND_CASES[3]
    batch = random_paged_batch(seq_lens, extend_lens, 8, 2, head_dim, torch.bfloat16, page_size=4, seed=head_dim)
    used = set()
    for row, length in zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
        used.update(batch.req_to_token[row, :length].tolist())
    unused = torch.tensor(sorted(set(range(batch.k_buffer.shape[0])) - used), dtype=torch.long)
    batch.k_buffer[unused] = float("nan")  # a padding key or a slot past a length read would show
    batch.v_buffer[unused] = float("nan")
    ref = batch.extend(extend_attention_ref)
    dot = batch.extend(extend_attention_cpu)  # AMX tiles where the CPU has them (has_amx)
    vdp = batch.extend(lambda *a: extend_attention_cpu(*a, amx=False))
    fp32 = batch.extend(lambda *a: extend_attention_cpu(*a, bf16_dot=False))
    assert torch.isfinite(dot).all() and torch.isfinite(vdp).all()
    assert rel_err(dot, ref) < TOLERANCE[torch.bfloat16] and rel_err(vdp, ref) < TOLERANCE[torch.bfloat16]
    assert rel_err(fp32, ref) < TOLERANCE[torch.bfloat16]
    assert l2_err(dot, ref) < 4e-3 and l2_err(vdp, ref) < 4e-3 and l2_err(fp32, ref) < 2e-4
    # the two bf16 paths round the same probabilities: they differ by summation order (and where a
    # probability's rounding flips), far less than either differs from the reference
    assert l2_err(dot, vdp) < 1e-3


# The decode path's scores in bf16 dot products straight from a bf16 pool (q and keys as they are,
# exact products summed in fp32): the quantized benchmark's GQA-3 heads, a GQA-4 and an MHA, at every
# head dim it has code for, across its 16-key vectors and 256-key chunks. Both products' operands are
# the widened path's values, so the two differ by summation order only (L2 ~1e-5 measured at GQA-3, 128).
@pytest.mark.parametrize("heads", [(12, 4), (8, 2), (4, 4)], ids=["gqa3", "gqa4", "mha"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_bf16_dot_decode_scores_match_reference(heads, head_dim, threads):
    batch = random_paged_batch(DECODE_LENS + [16, 48, 17], None, *heads, head_dim, torch.bfloat16, 1, seed=head_dim)
    ref = batch.decode(decode_attention_ref)
    dot = batch.decode(decode_attention_cpu)
    widened = batch.decode(lambda *a: decode_attention_cpu(*a, bf16_dot=False))
    assert rel_err(dot, ref) < TOLERANCE[torch.bfloat16] and rel_err(widened, ref) < TOLERANCE[torch.bfloat16]
    assert l2_err(dot, widened) < 1e-4


def test_bf16_dot_shared_prefix_decode_matches_reference():
    # The shared pass's big groups (80 and 24 rows a kv head) take the BLAS blocks, so the bf16 path.
    batch = shared_decode_batch((8, 2), 64, torch.bfloat16, 16, seed=9)
    ref = batch.decode(decode_attention_ref)
    assert rel_err(batch.decode(decode_attention_cpu), ref) < TOLERANCE[torch.bfloat16]
    assert rel_err(batch.decode(lambda *a: decode_attention_cpu(*a, amx=False)), ref) < TOLERANCE[torch.bfloat16]
    assert rel_err(batch.decode(lambda *a: decode_attention_cpu(*a, bf16_dot=False)), ref) < TOLERANCE[torch.bfloat16]


def test_reads_only_the_requests_slots():
    # Poison every slot no request owns (and cells past each length point at them): a read past
    # seq_len or of another request's slot would turn the output into NaN.
    batch = random_paged_batch([37, 5, 64], [10, 5, 1], 8, 2, 64, torch.float32, page_size=1, seed=11)
    used = set()
    for row, length in zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
        used.update(batch.req_to_token[row, :length].tolist())
    unused = torch.tensor(sorted(set(range(batch.k_buffer.shape[0])) - used), dtype=torch.long)
    assert unused.numel() > 0
    batch.k_buffer[unused] = float("nan")
    batch.v_buffer[unused] = float("nan")
    out = batch.extend(extend_attention_cpu)
    assert torch.isfinite(out).all()
    assert rel_err(out, batch.extend(extend_attention_ref)) < TOLERANCE[torch.float32]


def test_bad_lengths_raise_instead_of_reading_out_of_bounds():
    batch = random_paged_batch([10, 20], [2, 3], 4, 2, 64, torch.float32, seed=1)
    too_long = batch.req_to_token.shape[1] + 1
    batch.seq_lens[1] = too_long
    with pytest.raises(RuntimeError, match="exceeds req_to_token width"):
        batch.extend(extend_attention_cpu)
    batch.seq_lens[1] = 20
    batch.req_to_token[batch.req_pool_indices[0], 3] = batch.k_buffer.shape[0]  # one slot past the pool
    with pytest.raises(RuntimeError, match="outside the pool"):
        batch.extend(extend_attention_cpu)


def test_falls_back_to_the_reference_with_a_warning_when_it_cannot_build(monkeypatch):
    def no_compiler():
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(cpu_attention, "_loaded", {})
    monkeypatch.setattr(cpu_attention, "_build", no_compiler)
    batch = random_paged_batch([12, 30], [12, 4], 4, 2, 64, torch.float32, seed=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = batch.extend(extend_attention_cpu)
    assert any("could not be built" in str(w.message) and "no C++ compiler" in str(w.message) for w in caught)
    assert cpu_attention.cpu_attention_error() is not None
    assert torch.equal(out, batch.extend(extend_attention_ref))


def test_the_op_checks_shapes_itself():
    # Called directly (not through the wrappers' checks), mismatched metadata must raise too.
    batch = random_paged_batch([10, 20], [2, 3], 4, 2, 64, torch.float32, seed=1)
    o = torch.empty_like(batch.q)
    op = cpu_attention_op()
    with pytest.raises(RuntimeError, match="one length"):
        op(batch.q, batch.k_buffer, batch.v_buffer, o, batch.req_to_token, batch.req_pool_indices,
           batch.seq_lens[:1], batch.extend_lens, batch.qo_start_loc, batch.sm_scale)
    q3 = batch.q[:, :3].contiguous()  # 3 q heads over 2 kv heads
    with pytest.raises(RuntimeError, match="multiple of num_kv_heads"):
        op(q3, batch.k_buffer, batch.v_buffer, torch.empty_like(q3), batch.req_to_token,
           batch.req_pool_indices, batch.seq_lens, batch.extend_lens, batch.qo_start_loc, batch.sm_scale)


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    """A process killed mid-build leaves torch's `lock` behind, on which every later build would wait
    forever; an old one is removed (with a warning), a recent one (a build in progress) is kept."""
    import os
    import time as clock
    import warnings as w

    from vlserve.kernels.cpu_attention import STALE_LOCK_S, clear_stale_build_lock

    lock = tmp_path / "lock"
    lock.write_text("")
    assert not clear_stale_build_lock(str(tmp_path)) and lock.exists()
    old = clock.time() - STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    with w.catch_warnings(record=True) as caught:
        w.simplefilter("always")
        assert clear_stale_build_lock(str(tmp_path))
    assert not lock.exists() and any("stale build lock" in str(c.message) for c in caught)
    assert not clear_stale_build_lock(str(tmp_path))  # nothing there: nothing to do
