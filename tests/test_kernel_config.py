"""KernelConfig (vlserve/core/config.py): each switch really changes the path the model takes, the
other path gives the same logits, and `vlserve serve`'s flags build it. Which ops ran is read from
torch's profiler (our kernels are torch ops: vlserve_fused::*, vlserve_gemm::small_linear)."""

import argparse

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from vlserve.kernels.cpu_attention import cpu_attention_error, cpu_attention_op
from vlserve.core.config import EngineArgs, KernelConfig
from vlserve.core.forward_batch import ExtendSlice, build_forward_batch
from vlserve.cpu import gemm as cpu_gemm
from vlserve.cpu.gemm import CpuLinear, use_cpu_gemm
from vlserve.model.loader import load_model
from vlserve.testing.tiny import make_tiny_model
from vlserve.runner.model_runner import ModelRunner


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    assert cpu_attention_op() is not None, f"the CPU kernels did not build: {cpu_attention_error()}"
    assert torch.backends.mkldnn.is_available(), "this torch has no oneDNN: CpuLinear is never used"
    return make_tiny_model(str(tmp_path_factory.mktemp("kernels") / "tiny"), seed=0)


def _logits_and_ops(checkpoint: str, kernels: KernelConfig) -> tuple[torch.Tensor, set[str], nn.Module]:
    """One prefill of 12 tokens and one decode step; the last logits and every op name that ran."""
    loaded = load_model(checkpoint, kernels=kernels)
    runner = ModelRunner.standalone(loaded, max_total_tokens=64, context_length=32)
    memory = runner.memory
    row = memory.req_to_token.alloc()

    def forward(prefix_len: int, ids: list[int]) -> torch.Tensor:
        last = memory.req_to_token.table[row, prefix_len - 1].item() if prefix_len else -1
        slots = memory.allocator.alloc_extend(last, prefix_len, len(ids))
        memory.req_to_token.write(row, prefix_len, slots)
        batch = build_forward_batch([ExtendSlice(row, prefix_len, ids, slots)], memory.req_to_token.table,
                                    runner.vocab_size)
        return runner.forward(batch)

    ids = torch.randint(5, runner.vocab_size, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward(0, ids)
        logits = forward(12, [ids[-1]])
    return logits[-1].float(), {e.key for e in prof.key_averages()}, loaded.model


@pytest.fixture(scope="module")
def default_run(checkpoint):
    return _logits_and_ops(checkpoint, KernelConfig())


def _fused(ops: set[str]) -> set[str]:
    return {o for o in ops if o.startswith("vlserve_fused::")}


def test_default_takes_every_kernel_path(default_run):
    _, ops, model = default_run
    assert {"vlserve_fused::rms_norm", "vlserve_fused::silu_mul", "vlserve_fused::store_kv"} <= _fused(ops)
    assert all(type(m) is not nn.Linear for m in model.modules())
    assert sum(isinstance(m, CpuLinear) for m in model.modules()) > 0


def test_cpu_gemm_off_keeps_nn_linear(checkpoint, default_run):
    logits, ops, model = _logits_and_ops(checkpoint, KernelConfig(cpu_gemm=False))
    assert not any(isinstance(m, CpuLinear) for m in model.modules())
    assert "vlserve_gemm::small_linear" not in ops and not any(o.startswith("vlserve_decode_gemm::") for o in ops)
    torch.testing.assert_close(logits, default_run[0], atol=1e-4, rtol=1e-4)


def test_fused_ops_off_runs_no_fused_kernel(checkpoint, default_run):
    logits, ops, _ = _logits_and_ops(checkpoint, KernelConfig(fused_ops=False))
    assert _fused(ops) == set()
    torch.testing.assert_close(logits, default_run[0], atol=1e-4, rtol=1e-4)


def test_small_gemm_off_sends_its_rows_elsewhere(monkeypatch):
    # the small-row kernel serves plain weights: where our kernel runs a weight's dtype it is packed
    monkeypatch.setattr(cpu_gemm, "packed_kernel_rows", lambda dtype: range(0))
    torch.manual_seed(0)
    plain = nn.Linear(64, 48)
    on = use_cpu_gemm(CpuLinear.from_linear(plain))
    off = use_cpu_gemm(CpuLinear.from_linear(plain, use_small_gemm=False))
    small_rows = [r for r in range(1, 32) if on.path(r, torch.float32) == "small"]
    assert small_rows, "no row count takes the small-row kernel on this CPU: the switch cannot be seen"
    for rows in small_rows:
        assert off.path(rows, torch.float32) != "small"
        x = torch.randn(rows, 64)
        torch.testing.assert_close(off(x), F.linear(x, plain.weight, plain.bias), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(on(x), off(x), rtol=1e-5, atol=1e-5)


def test_conversion_shares_parameters_and_keeps_tied_weights():
    shared = nn.Parameter(torch.randn(10, 8))
    model = nn.Sequential(nn.Linear(8, 10), nn.Linear(8, 10, bias=False))
    model[0].weight = model[1].weight = shared
    use_cpu_gemm(model)
    assert all(isinstance(m, CpuLinear) for m in model)
    assert model[1].bias is None
    for m in model:  # the parameter, or where packed a copy of its values (cpu/gemm.py: one resident layout)
        assert m.weight is shared or (m.packed is not None and torch.equal(m.weight, shared))


def test_serve_flags_build_the_config():
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    args = EngineArgs.from_cli(parser.parse_args(["--disable-cpu-gemm", "--disable-fused-ops"]))
    assert KernelConfig.from_args(args) == KernelConfig(cpu_gemm=False, small_gemm=True, fused_ops=False)
    assert KernelConfig.from_args(EngineArgs()) == KernelConfig()
