"""The small-row CPU GEMM (kernels/csrc/small_gemm_cpu.cpp) against float64 matmul: every row count
it serves, K and N off the vector and register-block sizes, bias, bf16 weights, leading dims, one and
two threads; and CpuLinear sending 1–31 rows to it and the rest to BLAS."""

import pytest
import torch
import torch.nn.functional as F

from vlserve.kernels import cpu_attention, small_gemm
from vlserve.cpu import gemm as cpu_gemm


@pytest.fixture(scope="module")
def op():
    op = small_gemm.small_linear_op()
    assert op is not None, f"the CPU kernels did not build: {cpu_attention.cpu_attention_error()}"
    return op


def reference(x, w, b):
    y = x.double() @ w.double().t()
    return y if b is None else y + b.double()


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16, 31])
@pytest.mark.parametrize("n,k", [(64, 64), (1029, 1024), (7, 37), (13, 3)], ids=["even", "n-tail", "k-tail", "k<lanes"])
@pytest.mark.parametrize("bias", [False, True])
def test_fp32_matches_float64(op, threads, rows, n, k, bias):
    g = torch.Generator().manual_seed(rows * 1000 + n + k)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    y = op(x, w, b)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), reference(x, w, b), rtol=1e-5, atol=1e-5 * k ** 0.5)


@pytest.mark.parametrize("rows", [3, 16, 31])
def test_prefetch_changes_no_result(op, threads, rows):
    # the prefetch reads ahead into the next column block (and stops before the tail): the product
    # must be bit-identical with and without it, n-tail and bf16 weights included
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1024, generator=g)
    for w in (torch.randn(1029, 1024, generator=g), torch.randn(517, 1024, generator=g).bfloat16()):
        assert torch.equal(op(x, w, None), op(x, w, None, prefetch=False))


def test_bf16_weights_are_widened_exactly(op, threads):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 200, generator=g), torch.randn(45, 200, generator=g).bfloat16()
    torch.testing.assert_close(op(x, w, None).double(), reference(x, w.float(), None), rtol=1e-5, atol=1e-4)


def test_leading_dims_and_non_contiguous_input(op):
    x = torch.randn(8, 2, 64)[:, 0]  # a strided view
    w = torch.randn(30, 64)
    torch.testing.assert_close(op(x, w, None), F.linear(x, w), rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, 3, 64)
    assert op(x3, w, None).shape == (2, 3, 30)


def test_bad_arguments_raise(op):
    with pytest.raises(RuntimeError, match="x must be float32"):
        op(torch.randn(2, 8).double(), torch.randn(4, 8), None)
    with pytest.raises(RuntimeError, match="need x"):
        op(torch.randn(2, 8), torch.randn(4, 9), None)
    with pytest.raises(RuntimeError, match="bias must be"):
        op(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5))


def test_cpu_linear_routes_small_batches_of_a_plain_weight_to_the_kernel(op, monkeypatch):
    """A plain weight (where our decode-rows kernel does not run its dtype): every row count under
    SMALL_ROWS takes the kernel. A packed weight never does (test_decode_gemm.py)."""
    monkeypatch.setattr(cpu_gemm, "packed_kernel_rows", lambda dtype: range(0))
    layer = cpu_gemm.use_cpu_gemm(torch.nn.Linear(64, 48))
    assert layer.packed is None
    calls = []
    monkeypatch.setattr(small_gemm, "small_linear_op", lambda: (lambda *a: calls.append(a[0].shape[0]) or op(*a)))
    for rows in (1, 3, cpu_gemm.SMALL_ROWS - 1, cpu_gemm.SMALL_ROWS, 300):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert calls == [1, 3, cpu_gemm.SMALL_ROWS - 1]


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_the_kernels_run_on_torchs_threads(op, threads):
    """The extension's parallel regions use torch's thread count (a count, not a timing): built
    without OpenMP they run on one thread whatever torch is set to, and nothing else would notice."""
    assert torch.ops.vlserve_gemm.parallel_threads(64) == threads
