"""How many threads the model's CPU kernels and the media pool get.

torch defaults to the machine's physical cores, which overcounts in a container or under taskset
(the process may run on fewer CPUs than the machine has): OpenMP then runs more threads than
cores, and a GEMM waits at every barrier for a thread that is not running. The cores this process
may use are its CPU affinity set. Media decoding (Pillow, PyAV) runs on a thread pool beside the
engine loop; every decode thread running takes a core from a GEMM whose other threads then wait at
its barrier, so the pool is kept to what is left beside the compute threads (at least one).
"""

import os

import torch


def usable_cores() -> int:
    """CPUs this process may run on (its affinity set; os.cpu_count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def configure_compute_threads(requested: int | None = None) -> int:
    """Sets torch's intra-op threads: `requested`, else the usable cores (never more than torch's
    own default, the physical cores). Returns the number set."""
    threads = requested or min(usable_cores(), torch.get_num_threads())
    if threads < 1:
        raise ValueError(f"thread count must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    return threads


def media_workers(compute_threads: int, cores: int | None = None, cap: int = 4) -> int:
    """Media pool size: the cores left beside the compute threads, at least 1, at most `cap`."""
    cores = usable_cores() if cores is None else cores
    return max(1, min(cap, cores - compute_threads))
