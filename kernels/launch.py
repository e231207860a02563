"""Launch-time choices shared by the Triton kernels: padded head dim, dot operand types, SM count."""

import functools
import os

import torch
import triton

LOG2_E = 1.4426950408889634


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def padded_head_dim(head_dim: int) -> int:
    """BLOCK_D: the next power of two, at least 16 (tl.dot's smallest K on a GPU); masked past head_dim."""
    return max(16, triton.next_power_of_2(head_dim))


def dot_operands(dtype: torch.dtype) -> tuple[bool, str]:
    """(upcast, input_precision) for tl.dot.

    fp32 runs the dot in IEEE fp32 (not TF32) so it matches the reference to 1e-5. 16-bit operands
    go to the tensor cores as they are, except bf16 under the interpreter, which holds bf16 as raw
    uint16 and would multiply the bit patterns: there the kernels upcast loads to fp32.
    """
    upcast = dtype == torch.float32 or (dtype == torch.bfloat16 and interpreting())
    return upcast, "ieee" if upcast else "tf32"


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_compute_units(device: torch.device) -> int:
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 1
