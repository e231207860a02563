"""CpuLinear (vlserve/cpu/gemm.py): the same products as F.linear on every path it takes
(our small-row kernel below SMALL_ROWS, MKL below ONEDNN_MIN_ROWS where the kernel is unavailable,
oneDNN above; bf16 as is or widened to fp32), and the switch of a model's layers."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vlserve.cpu import gemm as cpu_gemm
from vlserve.cpu.gemm import ONEDNN_MIN_ROWS, SMALL_ROWS, UPCAST_MIN_ROWS, CpuLinear, use_cpu_gemm

ROWS = [1, ONEDNN_MIN_ROWS - 1, ONEDNN_MIN_ROWS, UPCAST_MIN_ROWS - 1, UPCAST_MIN_ROWS, SMALL_ROWS - 1, SMALL_ROWS, 300]


def _pair(bias: bool, dtype: torch.dtype):
    torch.manual_seed(0)
    plain = nn.Linear(96, 72, bias=bias).to(dtype)
    fast = nn.Linear(96, 72, bias=bias).to(dtype)
    fast.load_state_dict(plain.state_dict())
    return plain, use_cpu_gemm(fast)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", ROWS)
def test_fp32_matches_f_linear(bias, rows):
    plain, fast = _pair(bias, torch.float32)
    assert isinstance(fast, CpuLinear)
    x = torch.randn(rows, 96)
    torch.testing.assert_close(fast(x), plain(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", ROWS)
def test_bf16_matches_f_linear(rows):
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
    _, fast = _pair(False, torch.bfloat16)
    x = torch.randn(300, 96).bfloat16()  # past the small-row and the decode-rows kernels
    monkeypatch.setattr(cpu_gemm, "native_bf16", lambda: True)
    fast(x)
    assert torch.float32 not in calls  # bf16 as it is (through the packed weight where that pays)
    calls.clear()
    monkeypatch.setattr(cpu_gemm, "native_bf16", lambda: False)
    monkeypatch.setattr(cpu_gemm, "packed_weights_pay", lambda dtype: dtype == torch.float32)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weight_follows_the_parameter(monkeypatch, dtype):
    """The packed copy is rebuilt when the weight changes in place or is replaced: never a stale product."""
    if dtype == torch.bfloat16 and not cpu_gemm.native_bf16():
        # oneDNN packs bf16 weights only where it has bf16 kernels: elsewhere the path is never taken
        assert not cpu_gemm.packed_weights_pay(torch.bfloat16)
        return
    monkeypatch.setattr(cpu_gemm, "packed_weights_pay", lambda d: torch.backends.mkldnn.is_available())
    plain, fast = _pair(True, dtype)
    x = torch.randn(40, 96).to(dtype)
    first = fast(x)
    assert "_packed" in fast.__dict__
    with torch.no_grad():
        fast.weight.mul_(-1)
        plain.weight.mul_(-1)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.1, rtol=0.02)
    torch.testing.assert_close(fast(x), plain(x), **tol)
    fast.weight = nn.Parameter(torch.zeros_like(fast.weight))
    assert torch.equal(fast(x).float(), fast.bias.float().expand(40, -1))
    assert not torch.equal(first, fast(x))


def test_weights_are_packed_at_load_unless_memory_is_short(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "packed_weights_pay", lambda d: torch.backends.mkldnn.is_available())
    _, fast = _pair(False, torch.float32)  # use_cpu_gemm packed it, with this machine's free memory
    assert "_packed" in fast.__dict__
    _, short = _pair(False, torch.float32)
    short.__dict__.pop("_packed")
    assert cpu_gemm.pack_weights([short], free_bytes=96 * 72 * 4 * 3) == 0  # copies over a quarter of what is free
    assert short.pack is False
    x = torch.randn(40, 96)
    torch.testing.assert_close(short(x), F.linear(x, short.weight), atol=1e-5, rtol=1e-5)
    assert "_packed" not in short.__dict__  # ran on the plain weight
    # one copy for oneDNN, and one for the decode-rows kernel where that runs (kernels/decode_gemm.py)
    copies = 1 + cpu_gemm.decode_weights_pay(torch.float32)
    assert cpu_gemm.pack_weights([short], free_bytes=96 * 72 * 4 * 4 * copies) == 96 * 72 * 4 * copies
    assert ("_decode_packed" in short.__dict__) == (copies == 2)


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
    """Pretends the CPU has (True) or lacks (False) AMX tiles for one test. decode_gemm_rows is cached
    per process and reads amx_bf16: an answer computed under the pretence must not outlive the test
    (test_decode_gemm.py would then find this CPU's bf16 rows to be an AMX CPU's)."""
    def pretend(has_amx: bool) -> None:
        monkeypatch.setattr(cpu_gemm, "amx_bf16", lambda: has_amx)
        cpu_gemm.decode_gemm_rows.cache_clear()
    yield pretend
    cpu_gemm.decode_gemm_rows.cache_clear()


def test_bf16_primitives_are_not_warmed_without_amx(monkeypatch, pretend_amx):
    calls = []
    real = cpu_gemm._onednn
    monkeypatch.setattr(cpu_gemm, "_onednn", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    pretend_amx(False)
    layer = use_cpu_gemm(nn.Linear(64, 32).to(torch.bfloat16))
    assert calls == []  # built on first use: cheap there
    x = torch.randn(37, 64).to(torch.bfloat16)
    torch.testing.assert_close(layer(x).float(), F.linear(x.float(), layer.weight.float(), layer.bias.float()),
                               atol=5e-2, rtol=2e-2)


def test_bf16_primitives_are_warmed_at_load_with_amx_and_native_kernels(monkeypatch, pretend_amx):
    calls = []
    real = cpu_gemm._onednn
    monkeypatch.setattr(cpu_gemm, "_onednn", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    pretend_amx(True)  # the warming logic runs wherever native kernels do
    layers = [use_cpu_gemm(nn.Linear(64, 32).to(torch.bfloat16)) for _ in range(2)]  # warms as it loads
    if cpu_gemm.native_bf16():
        # one layer of the shape warmed (the second adds no shape), every padded count oneDNN takes
        expected = [r for r in sorted({cpu_gemm.onednn_rows(r) for r in range(1, cpu_gemm.WARM_ROWS + 1)})
                    if cpu_gemm._goes_to_onednn(layers[0], r)]
        assert calls[:len(expected)] == expected and expected
        calls.clear()  # a layer whose calls are too big to be worth warming: only the counts under the cap
        # (the cap admits the first count oneDNN takes: which that is depends on the CPU's decode rows)
        monkeypatch.setattr(cpu_gemm, "WARM_MAX_FLOP", 2 * expected[0] * 64 * 40)
        use_cpu_gemm(nn.Linear(64, 40).to(torch.bfloat16))  # a new shape: warmed as it loads
        assert calls == expected[:1]
    calls.clear()
    assert cpu_gemm.warm_onednn([nn.Linear(64, 32)]) == 0  # fp32: built on first use
    assert calls == []
