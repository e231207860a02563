"""Keep the CPU's freed activations for reuse instead of handing them back to the kernel.

PyTorch's CPU tensors come from malloc. glibc serves a large request (from 128 KiB, its threshold
rising with use to 32 MiB at most) with a fresh mmap and unmaps it on free, so every large
activation of every forward (a 2,048-row prefill chunk's MLP output is 46 MB) arrives as untouched
pages: the first write to each 4 KiB page faults and the kernel zeroes it. Measured here: allocating
and filling 46 MB took 31 ms that way against 5 ms from reused heap memory, and one 2,048-row GEMM
into a fresh output 394 ms against 357 ms (one thread). PyTorch's own CUDA caching allocator exists
for the same reason; on the CPU, glibc can be told to keep what is freed:

- M_MMAP_THRESHOLD: requests up to this size come from the heap, which reuses freed chunks;
- M_TRIM_THRESHOLD: the heap is not shrunk back to the kernel until this much is free at its top;
- M_ARENA_MAX = 1: every thread allocates from the main heap, which can grow without bound (a
  thread's own arena is built of 64 MB heaps, past which glibc maps again); this must be set before
  the engine's threads first allocate.

The cost: the process keeps its peak of activation memory resident after a burst, as a caching
allocator does. Not glibc (musl, macOS, Windows): nothing is changed.
"""

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's malloc.h
KEEP_BELOW = 1 << 30  # allocations up to 1 GiB come from the heap; a larger KV pool is still mapped lazily
TRIM_ABOVE = (1 << 31) - 1  # mallopt takes an int


@functools.cache
def keep_freed_memory() -> bool:
    """Sets the three glibc parameters above, once per process; False where malloc is not glibc's
    or refused one of them."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    done = all(mallopt(param, value) == 1 for param, value in
               ((M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, KEEP_BELOW), (M_TRIM_THRESHOLD, TRIM_ABOVE)))
    log.debug("glibc malloc keeps freed memory: %s", done)
    return done


def release_freed_memory() -> bool:
    """Hands the heap's free pages back to the kernel (glibc's malloc_trim): once, after loading, when
    the checkpoint's plain tensors are dropped for their packed layouts and keep_freed_memory would
    otherwise keep their pages resident for good. False where malloc is not glibc's."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    return bool(trim(0))
