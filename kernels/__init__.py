"""Triton paged-attention kernels and their PyTorch references (installed as vlserve.kernels; imports
torch/triton only).

- decode_attention / extend_attention: Triton kernels (imported on first use, so that importing this
  package never needs triton, and TRITON_INTERPRET set later still takes effect).
- decode_attention_ref / extend_attention_ref: PyTorch references with the same signatures.
- decode_attention_cpu / extend_attention_cpu: one batched C++ call for the whole batch on the CPU
  (cpu_attention.py; built on first use, the references where it cannot be built).
- triton_available(): whether the Triton kernels can run here.
"""

import importlib
import os
import sys
import types

from .cpu_attention import decode_attention_cpu, extend_attention_cpu
from .reference import decode_attention_ref, extend_attention_ref

__all__ = ["decode_attention", "extend_attention", "decode_attention_cpu", "extend_attention_cpu",
           "decode_attention_ref", "extend_attention_ref", "triton_available"]

_TRITON_KERNELS = {"decode_attention": ".decode_attention", "extend_attention": ".extend_attention"}


def triton_available() -> bool:
    """True when triton imports and there is somewhere to run it: a CUDA GPU, or TRITON_INTERPRET=1."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1"


def __getattr__(name):
    if name in _TRITON_KERNELS:
        try:
            module = importlib.import_module(_TRITON_KERNELS[name], __name__)
        except ImportError as e:
            raise ImportError(f"the Triton {name} kernel needs triton ({e}); use {name}_ref instead") from e
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _KernelsPackage(types.ModuleType):
    # Importing the submodule decode_attention makes Python set the package attribute
    # decode_attention to that module; keep the name bound to the function instead.
    def __setattr__(self, name, value):
        if name in _TRITON_KERNELS and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _KernelsPackage
