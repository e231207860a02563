"""Huge-page copies (vlserve/model/huge_pages.py): the same values, a 2 MiB-aligned start in a mapping
that the kernel may back with transparent huge pages, alive as long as the copy; and the decode
kernel's packed weights (CpuLinear.decode_weight) are such copies."""

import gc

import pytest
import torch
from torch import nn

from vlserve.model import cpu_gemm
from vlserve.model.huge_pages import HUGE_PAGE, MIN_BYTES, huge_page_copy


def thp_mode() -> str:
    """The system's THP setting: always, madvise or never."""
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        return f.read().split("[")[1].split("]")[0]


def vma_field(address: int, field: str) -> int:
    """`field` of the mapping that holds `address`, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == field + ":":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_copy_has_the_values_and_a_huge_page_aligned_start():
    t = torch.randn(1024, 1536).to(torch.bfloat16)  # 3 MiB
    copy = huge_page_copy(t)
    assert torch.equal(copy, t) and copy.dtype == t.dtype and copy.shape == t.shape and copy.is_contiguous()
    assert copy.data_ptr() != t.data_ptr()
    assert copy.data_ptr() % HUGE_PAGE == 0


def test_the_mapping_is_marked_for_huge_pages_where_the_system_allows():
    copy = huge_page_copy(torch.ones(3 * HUGE_PAGE // 4))
    eligible = vma_field(copy.data_ptr(), "THPeligible")
    assert eligible == (1 if thp_mode() in ("always", "madvise") else 0)


def test_the_copy_outlives_its_source_and_every_other_reference():
    t = torch.arange(MIN_BYTES // 4, dtype=torch.float32)
    copy = huge_page_copy(t)
    del t
    gc.collect()
    assert copy[-1].item() == MIN_BYTES // 4 - 1
    copy += 1
    assert copy[0].item() == 1


def test_small_or_strided_tensors_come_back_contiguous_unchanged():
    small = torch.randn(16, 16)
    assert huge_page_copy(small) is small
    strided = torch.randn(1024, 1024).t()
    out = huge_page_copy(strided)
    assert out.is_contiguous() and torch.equal(out, strided)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_weights_are_huge_page_copies(dtype):
    if not cpu_gemm.decode_weights_pay(dtype):
        pytest.fail(f"the decode-rows kernel does not run {dtype} here: this CPU lacks the instructions")
    layer = nn.Linear(1024, 2816, bias=False).to(dtype)
    cpu_gemm.use_cpu_gemm(layer)
    packed = layer.decode_weight()
    assert packed.data_ptr() % HUGE_PAGE == 0
    x = torch.randn(24, 1024).to(dtype)
    want = cpu_gemm.decode_gemm.linear(x, cpu_gemm.decode_gemm.pack(layer.weight.detach()), 2816, None)
    assert torch.equal(layer(x), want)
