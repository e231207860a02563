"""The engine's memory budget, stated at start-up: the bytes of the weights (of which the packed
layouts), the KV pool and a chunk's activations, and the pool sized by --mem-fraction-static.

--mem-fraction-static is SGLang's flag with SGLang's meaning: the share of the memory the engine can
use that goes to static allocations, the weights and the KV pool together; the rest is left for
activations and everything else. The memory the engine can use is, on a GPU, the device's total;
on the host, what was available when the engine started (MemAvailable, so page cache counts as
free) plus what the process already held, since other processes share the machine. The weights are
measured once loaded (their resident bytes, packed layouts included), and the pool gets the share's
remainder: sized from what is really left, not from a guess of the weights' size.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

from vlserve.cpu.gemm import CpuLinear

log = logging.getLogger(__name__)

MIN_POOL_TOKENS = 1024  # the pool is never smaller: a share that leaves less is said at start-up
MAX_POOL_TOKENS = 1 << 18  # nor larger by default (--max-total-tokens sets any size)


@dataclass
class WeightBytes:
    """The model's resident weights: every parameter and buffer once (shared storages once), and the
    packed layouts among them (`packed`; `extra`: packed layouts kept beside a plain weight that
    another module holds, a tied LM head's)."""

    total: int
    packed: int
    extra: int


def weight_bytes(model: nn.Module) -> WeightBytes:
    seen: set[int] = set()
    total = packed = 0

    def count(t: torch.Tensor) -> int:
        if t.is_meta or t.is_mkldnn:
            return 0
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()

    for m in model.modules():
        for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
            total += count(t)
        if isinstance(m, CpuLinear) and m.packed is not None:
            size = count(m.packed)
            total += size
            packed += size
    report = model.__dict__.get("cpu_gemm_report")
    return WeightBytes(total, packed, report.extra_bytes if report is not None else 0)


def process_rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process (its /proc statm), 0 where there is no /proc."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def host_available_bytes() -> int:
    """MemAvailable (free memory plus what the kernel can reclaim, page cache included); MemFree where
    the kernel does not say it."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def usable_bytes(device: str) -> int:
    """The memory the engine can use, taken before it loads anything (see the module's docstring)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info()[1]
    return host_available_bytes() + process_rss_bytes()


@dataclass
class MemoryBudget:
    usable: int  # bytes the engine can use (usable_bytes)
    fraction: float  # --mem-fraction-static
    weights: WeightBytes
    bytes_per_slot: int  # the KV pool's bytes per token
    kv_pool: int = 0  # bytes, once the pool is made
    pool_tokens: int = 0
    activations: int = 0  # one prefill chunk's largest live activations (cpu/prefault.py)

    def pool_tokens_for_fraction(self) -> tuple[int, str]:
        """The pool's size in tokens for --mem-fraction-static, and a note when it was clamped."""
        left = self.fraction * self.usable - self.weights.total
        tokens = int(left // self.bytes_per_slot) if left > 0 else 0
        if tokens < MIN_POOL_TOKENS:
            return MIN_POOL_TOKENS, (f"--mem-fraction-static {self.fraction} of {_gb(self.usable)} leaves "
                                     f"{_gb(max(left, 0))} after the weights' {_gb(self.weights.total)}: the pool "
                                     f"takes its minimum of {MIN_POOL_TOKENS} tokens")
        if tokens > MAX_POOL_TOKENS:
            return MAX_POOL_TOKENS, f"capped at {MAX_POOL_TOKENS} tokens (--max-total-tokens sets any size)"
        return tokens, ""

    def log(self) -> None:
        w = self.weights
        log.info("memory: weights %s (packed layouts %s of them, %s beside a plain weight), KV pool %s "
                 "(%d tokens, %d bytes each), activations %s (one prefill chunk); static share %.2f of %s usable",
                 _gb(w.total), _gb(w.packed), _gb(w.extra), _gb(self.kv_pool), self.pool_tokens,
                 self.bytes_per_slot, _gb(self.activations), self.fraction, _gb(self.usable))

    def memory_usage(self) -> dict:
        """For /get_server_info: SGLang's memory_usage keys (GB) and the bytes behind them."""
        return {"weight": round(self.weights.total / 2**30, 3), "kvcache": round(self.kv_pool / 2**30, 3),
                "token_capacity": self.pool_tokens, "activations": round(self.activations / 2**30, 3),
                "bytes": {"weights": self.weights.total, "packed_layouts": self.weights.packed,
                          "packed_beside_plain": self.weights.extra, "kv_pool": self.kv_pool,
                          "activations": self.activations, "usable": self.usable},
                "mem_fraction_static": self.fraction}

    def as_dict(self) -> dict:
        return asdict(self)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"
