"""CpuLinear (vlserve/cpu/gemm.py): the same products as F.linear on every path it takes
(our kernel on the one packed layout; on a plain weight our small-row kernel below SMALL_ROWS, MKL
below ONEDNN_MIN_ROWS where the kernel is unavailable, oneDNN above; bf16 as is or widened to fp32),
one resident layout per weight, and the switch of a model's layers."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vlserve.cpu import gemm as cpu_gemm
from vlserve.kernels import decode_gemm
from vlserve.cpu.gemm import ONEDNN_MIN_ROWS, SMALL_ROWS, UPCAST_MIN_ROWS, CpuLinear, use_cpu_gemm
from vlserve.cpu.tied_embedding import PackedRowsEmbedding

ROWS = [1, ONEDNN_MIN_ROWS - 1, ONEDNN_MIN_ROWS, UPCAST_MIN_ROWS - 1, UPCAST_MIN_ROWS, SMALL_ROWS - 1, SMALL_ROWS, 300]


def _pair(bias: bool, dtype: torch.dtype):
    torch.manual_seed(0)
    plain = nn.Linear(96, 72, bias=bias).to(dtype)
    fast = nn.Linear(96, 72, bias=bias).to(dtype)
    fast.load_state_dict(plain.state_dict())
    return plain, use_cpu_gemm(fast)


@pytest.fixture(params=["packed", "plain"])
def layout(request, monkeypatch):
    """Each product test on both layouts: packed where our kernel runs the dtype, and plain (as on a
    CPU where it does not)."""
    if request.param == "plain":
        monkeypatch.setattr(cpu_gemm, "packed_kernel_rows", lambda dtype: range(0))
    return request.param


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", ROWS)
def test_fp32_matches_f_linear(bias, rows, layout):
    plain, fast = _pair(bias, torch.float32)
    assert isinstance(fast, CpuLinear)
    x = torch.randn(rows, 96)
    torch.testing.assert_close(fast(x), plain(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", ROWS)
def test_bf16_matches_f_linear(rows, layout):
    plain, fast = _pair(True, torch.bfloat16)
    x = torch.randn(rows, 96).bfloat16()
    out = fast(x)
    assert out.dtype == torch.bfloat16
    # fp32 of the same bf16 operands: the widened path is at least as exact as bf16 F.linear.
    exact = F.linear(x.float(), plain.weight.float(), plain.bias.float())
    assert (out.float() - exact).abs().max() <= 2 * (plain(x).float() - exact).abs().max() + 1e-2


def test_bf16_widening_only_without_native_kernels(monkeypatch):
    calls = []
    real = cpu_gemm._onednn
    monkeypatch.setattr(cpu_gemm, "_onednn", lambda x, w, b: calls.append(x.dtype) or real(x, w, b))
    monkeypatch.setattr(cpu_gemm, "packed_kernel_rows", lambda dtype: range(0))  # a plain weight
    _, fast = _pair(False, torch.bfloat16)
    assert fast.packed is None
    x = torch.randn(300, 96).bfloat16()  # past the small-row kernel
    monkeypatch.setattr(cpu_gemm, "native_bf16", lambda: True)
    fast(x)
    assert calls == [torch.bfloat16]  # bf16 as it is
    calls.clear()
    monkeypatch.setattr(cpu_gemm, "native_bf16", lambda: False)
    fast(x)
    assert calls == [torch.float32]


def test_batched_input_and_state_dict_are_kept():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8, bias=False))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 7, 16)
    expected = model(x)
    assert use_cpu_gemm(model) is model
    assert all(isinstance(model[i], CpuLinear) for i in (0, 2))
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def _packs(dtype: torch.dtype) -> bool:
    return bool(cpu_gemm.packed_kernel_rows(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_resident_layout_per_weight(dtype):
    """Where our kernel runs the dtype, the weight is held once, packed: no plain parameter, no
    oneDNN copy; `weight` and the state dict give back the same values."""
    plain, fast = _pair(True, dtype)
    if not _packs(dtype):
        assert fast.packed is None and "weight" in fast._parameters
        return
    assert "weight" not in fast._parameters and fast.packed is not None
    assert fast.packed.numel() * 4 == decode_gemm.packed_bytes(72, 96, dtype)
    assert not any(isinstance(v, torch.Tensor) and v is not fast.packed for v in fast.__dict__.values())
    assert fast.cpu_gemm_report.packed_bytes == decode_gemm.packed_bytes(72, 96, dtype)
    assert torch.equal(fast.weight, plain.weight)
    assert torch.equal(fast.state_dict()["weight"], plain.weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_new_weight_is_packed_again(dtype):
    """Assigning a weight or loading a state dict replaces the packed layout: never a stale product."""
    plain, fast = _pair(True, dtype)
    x = torch.randn(40, 96).to(dtype)
    first = fast(x)
    with torch.no_grad():
        plain.weight.mul_(-1)
    fast.load_state_dict(plain.state_dict())
    assert (fast.packed is not None) == _packs(dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.1, rtol=0.02)
    torch.testing.assert_close(fast(x), plain(x), **tol)
    fast.weight = nn.Parameter(torch.zeros(72, 96, dtype=dtype))
    assert torch.equal(fast(x).float(), fast.bias.float().expand(40, -1))
    assert (fast.packed is not None) == _packs(dtype)  # packed again at its first use
    assert not torch.equal(first, fast(x))
    with pytest.raises(RuntimeError, match="size mismatch"):
        fast.load_state_dict({"weight": torch.zeros(72, 95, dtype=dtype), "bias": fast.bias})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_past_the_kernels_run_oneDNN_on_unpacked_chunks(monkeypatch, dtype):
    """AVX2 and AMX prefills: oneDNN over the packed layout's columns, unpacked a chunk at a time."""
    if not _packs(dtype):
        pytest.skip(f"our kernel does not run {dtype} here: nothing is packed")
    monkeypatch.setattr(cpu_gemm, "packed_kernel_rows", lambda d: range(1, 9))
    monkeypatch.setattr(cpu_gemm, "UNPACK_COLUMNS", 32)  # three chunks of 72 columns, the last short
    plain, fast = _pair(True, dtype)
    x = torch.randn(3, 50, 96).to(dtype)
    assert fast.path(150, dtype) == "unpacked" and fast.path(8, dtype) == "packed"
    out = fast(x)
    assert out.shape == (3, 50, 72)
    exact = F.linear(x.float(), plain.weight.float(), plain.bias.float())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), exact, atol=tol * exact.abs().max().item(), rtol=tol)


def test_a_shared_weight_is_packed_only_while_the_copy_fits(caplog):
    """A tied LM head keeps the embedding's plain weight, so its packed layout is an extra copy: past
    PACK_MEMORY_SHARE of the free memory it stays plain, and the log names the layer and the cost."""
    if not _packs(torch.float32):
        pytest.skip("our kernel does not run fp32 here: nothing is packed")
    emb = nn.Embedding(72, 96)
    head = CpuLinear.from_linear(nn.Linear(96, 72, bias=False))
    head.weight = emb.weight
    size = decode_gemm.packed_bytes(72, 96, torch.float32)
    with caplog.at_level("WARNING"):
        report = cpu_gemm.pack_weights({"lm_head": head}, shared={id(emb.weight)}, free_bytes=3 * size)
    assert head.packed is None and report.extra_bytes == 0 and report.plain[0][0] == "lm_head"
    assert "lm_head" in caplog.text and "slower" in caplog.text
    x = torch.randn(4, 96)
    torch.testing.assert_close(head(x), F.linear(x, emb.weight), atol=1e-5, rtol=1e-5)
    assert head.packed is None  # not packed behind the report's back at first use
    head.pack_on_use = True
    report = cpu_gemm.pack_weights({"lm_head": head}, shared={id(emb.weight)}, free_bytes=4 * size)
    assert head.packed is not None and report.extra_bytes == size and emb.weight.shape == (72, 96)


class _TiedLM(nn.Module):
    """An embedding and an LM head sharing one weight, as a tied decoder holds them (151 x 96: the last
    block of 16 rows short)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        torch.manual_seed(5)
        self.embed = nn.Embedding(151, 96).to(dtype)
        self.lm_head = nn.Linear(96, 151, bias=False).to(dtype)
        self.lm_head.weight = self.embed.weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tied_embedding_reads_its_rows_from_the_heads_packed_layout(dtype):
    """One copy serves the tied pair: the head packed like any layer (no extra copy, none left plain),
    the embedding holding no weight of its own and giving exactly the original rows."""
    if not _packs(dtype):
        pytest.skip(f"our kernel does not run {dtype} here: nothing is packed")
    model = _TiedLM(dtype)
    weight = model.embed.weight.detach().clone()
    use_cpu_gemm(model)
    report = model.cpu_gemm_report
    assert isinstance(model.embed, PackedRowsEmbedding) and list(model.embed.parameters()) == []
    assert model.lm_head.packed is not None and report.extra_bytes == 0 and not report.plain
    assert report.tied == ["embed"] and report.packed_bytes == decode_gemm.packed_bytes(151, 96, dtype)
    ids = torch.tensor([[0, 150, 17], [144, 15, 16]])
    assert torch.equal(model.embed(ids), weight[ids])  # the rows as they were, bit for bit
    x = torch.randn(3, 96).to(dtype)
    exact = F.linear(x.float(), weight.float())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(model.lm_head(x).float(), exact, atol=tol * exact.abs().max().item(), rtol=tol)
    state = model.state_dict()
    assert torch.equal(state["embed.weight"], weight) and torch.equal(state["lm_head.weight"], weight)
    with pytest.raises(IndexError, match=r"\[0, 151\)"):
        model.embed(torch.tensor([151]))  # a padding lane of the last block is no row


def test_a_tied_embedding_loads_a_new_weight_into_the_head():
    if not _packs(torch.float32):
        pytest.skip("our kernel does not run fp32 here: nothing is packed")
    model = use_cpu_gemm(_TiedLM(torch.float32))
    new = torch.randn(151, 96)
    model.load_state_dict({"embed.weight": new}, strict=False)
    assert model.lm_head.packed is not None
    assert torch.equal(model.embed(torch.arange(151)), new) and torch.equal(model.lm_head.weight, new)


def test_onednn_row_counts_are_padded_to_a_few_buckets_with_amx():
    counts = {cpu_gemm.onednn_rows(r, coarse=True) for r in range(1, 2049)}
    assert len(counts) <= 48  # each a primitive oneDNN builds once
    for r in range(1, 5000):
        padded = cpu_gemm.onednn_rows(r, coarse=True)
        assert r <= padded <= r + max(15, (r - 1) // 8) and padded % 16 == 0


def test_onednn_row_counts_without_amx_take_at_most_15_zero_rows():
    # there a new count's build is cheap and the coarse buckets' padding was 5-12% more arithmetic
    for r in range(1, 5000):
        padded = cpu_gemm.onednn_rows(r, coarse=False)
        assert r <= padded < r + 16 and padded % 16 == 0
    assert cpu_gemm.onednn_rows(520, coarse=False) == 528 and cpu_gemm.onednn_rows(520, coarse=True) == 576
    assert cpu_gemm.onednn_rows(700) == cpu_gemm.onednn_rows(700, coarse=cpu_gemm.amx_bf16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(37, 64), (3, 45, 64), (130, 64), (1000, 64)])
def test_padded_onednn_calls_return_the_real_rows_only(dtype, shape):
    # The padding rows are zeros: their outputs (the bias) must never reach the result, whose rows
    # are the unpadded product's, leading dims kept.
    torch.manual_seed(shape[0])
    w, b = torch.randn(48, 64).to(dtype), torch.randn(48).to(dtype)
    x = torch.randn(*shape).to(dtype)
    out = cpu_gemm._onednn(x, w, b)
    assert out.shape == (*shape[:-1], 48) and out.is_contiguous()
    exact = F.linear(x.float(), w.float(), b.float())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), exact, atol=tol * exact.abs().max().item(), rtol=tol)


@pytest.fixture
def pretend_amx(monkeypatch):
    """Pretends the CPU has (True) or lacks (False) AMX tiles for one test. packed_kernel_rows is cached
    per process and reads amx_bf16: an answer computed under the pretence must not outlive the test
    (test_decode_gemm.py would then find this CPU's bf16 rows to be an AMX CPU's)."""
    def pretend(has_amx: bool) -> None:
        monkeypatch.setattr(cpu_gemm, "amx_bf16", lambda: has_amx)
        cpu_gemm.packed_kernel_rows.cache_clear()
    yield pretend
    cpu_gemm.packed_kernel_rows.cache_clear()


@pytest.mark.parametrize("has_amx", [False, True])
def test_bf16_primitives_are_built_on_first_use_not_at_load(monkeypatch, pretend_amx, has_amx):
    """Bug caught: on an AMX CPU every padded row count up to 1,024 was built at load, and each
    primitive keeps scratch memory of its own: a bf16 server held 110 MB over its budget."""
    calls = []
    real = cpu_gemm._onednn
    monkeypatch.setattr(cpu_gemm, "_onednn", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    pretend_amx(has_amx)
    layer = use_cpu_gemm(nn.Linear(64, 32).to(torch.bfloat16))
    assert calls == []
    x = torch.randn(300, 64).to(torch.bfloat16)
    torch.testing.assert_close(layer(x).float(), F.linear(x.float(), layer.weight.float(), layer.bias.float()),
                               atol=5e-2, rtol=2e-2)
