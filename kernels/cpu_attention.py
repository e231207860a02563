"""Batched paged attention on the CPU: one C++ call per layer for a whole decode or extend batch.

Same signatures as the references (reference.py), which loop over requests, gather each one's KV
out of the pool and call SDPA; this reads KV through req_to_token in place, GQA-aware, with an
online softmax in fp32 (csrc/paged_attention_cpu.cpp). The C++ builds on first use through
torch.utils.cpp_extension (about a minute, then cached); where it cannot be built (no compiler),
a warning says why, once, and the references run instead.

The same extension carries the small-row GEMM (csrc/small_gemm_cpu.cpp, small_gemm.py) and the fused
elementwise steps of a decoder layer (csrc/fused_cpu.cpp, fused.py): one build, one fallback
decision for every CPU kernel of ours.
"""

import hashlib
import os
import platform
import threading
import time
import warnings

import torch

from .reference import decode_attention_ref, extend_attention_ref
from .validate import check_decode_args, check_extend_args

_SOURCES = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", name)
            for name in ("paged_attention_cpu.cpp", "small_gemm_cpu.cpp", "fused_cpu.cpp", "decode_gemm_cpu.cpp")]
_HEADERS = [os.path.join(os.path.dirname(_SOURCES[0]), name)
            for name in ("vec_cpu.h", "bf16_dot_cpu.h", "f32_tiles_cpu.h", "amx_cpu.h")]  # vector types; tiles
_lock = threading.Lock()
_loaded: dict[str, object] = {}  # "op": the torch op, or "error": why it could not be built


def _extension_name() -> str:
    # Built with -march=native: the name carries the CPU's flags, so a build directory shared
    # between different machines never hands one a binary for the other; and the sources' hash, so
    # two checkouts of different versions on one machine (a test run beside a fresh clone's CI)
    # never rebuild the same folder under each other and load the other's library.
    flags = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), flags)
    except OSError:
        pass
    digest = hashlib.sha1(flags.encode())
    for path in _SOURCES + _HEADERS:
        with open(path, "rb") as f:
            digest.update(f.read())
    return "vlserve_cpu_attention_" + digest.hexdigest()[:10]


STALE_LOCK_S = 900  # a build takes about a minute (a few on a loaded machine); a lock this old is orphaned


def clear_stale_build_lock(build_dir: str, max_age_s: float = STALE_LOCK_S) -> bool:
    """torch's build lock (`lock` in the build folder) outlives a process killed mid-build, and every
    later process then waits on it forever. Remove one older than max_age_s; True if removed."""
    lock = os.path.join(build_dir, "lock")
    try:
        age = time.time() - os.path.getmtime(lock)
    except OSError:
        return False
    if age < max_age_s:
        return False
    warnings.warn(f"vlserve: removing a stale build lock ({lock}, {age / 60:.0f} min old) left by a process "
                  "killed while building the CPU attention kernel", RuntimeWarning, stacklevel=2)
    try:
        os.remove(lock)
    except FileNotFoundError:
        pass
    return True


def _build():
    from torch.utils import cpp_extension

    name = _extension_name()
    if hasattr(cpp_extension, "_get_build_directory"):  # torch's own folder rule (private, so checked)
        clear_stale_build_lock(cpp_extension._get_build_directory(name, verbose=False))
    load = cpp_extension.load
    # -fopenmp: at::parallel_for is a header whose `#pragma omp parallel` is silently ignored
    # without it, and every kernel would then run on one thread whatever torch's thread count.
    load(name=name, sources=_SOURCES, extra_cflags=["-O3", "-march=native", "-fopenmp"],
         extra_ldflags=["-fopenmp"],
         is_python_module=False, verbose=False)
    return torch.ops.vlserve_cpu.paged_attention


def cpu_attention_op():
    """The compiled op, or None (after one warning) when it cannot be built here."""
    if "op" in _loaded or "error" in _loaded:
        return _loaded.get("op")
    with _lock:
        if "op" not in _loaded and "error" not in _loaded:
            try:
                _loaded["op"] = _build()
            except Exception as e:  # no compiler, no headers, a failed build: all mean "fall back"
                _loaded["error"] = f"{type(e).__name__}: {e}"
                warnings.warn("vlserve: the batched CPU attention kernel could not be built "
                              f"({_loaded['error'][:300]}); using the slower per-request PyTorch "
                              "reference. Installing gcc/g++ enables it.", RuntimeWarning, stacklevel=3)
    return _loaded.get("op")


def cpu_attention_error() -> str | None:
    """Why the kernel is unavailable (None when it built, or was never tried)."""
    return _loaded.get("error")


def decode_attention_cpu(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, sm_scale,
                         num_kv_splits=None, share_prefixes: bool = True, bf16_dot: bool = True,
                         amx: bool = True) -> None:
    """o[b] = attention of q[b] over tokens 0..seq_lens[b]-1 of request req_pool_indices[b].

    Requests whose tables begin with the same slots (a prefix the radix cache shares) read those keys
    once for the group (see the kernel's header); share_prefixes=False reads them per request, for
    measuring what that saves. bf16_dot=False keeps a bf16 pool's big blocks on fp32 BLAS instead
    of bf16 dot products (has_bf16_dot), for the same purpose; amx=False keeps them on vdpbf16ps
    where the CPU has AMX tiles (has_amx)."""
    op = cpu_attention_op() if q.is_cpu else None  # the kernel is CPU-only; elsewhere the references run
    if op is None:
        return decode_attention_ref(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, sm_scale)
    check_decode_args(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens)
    batch = q.shape[0]
    ones = torch.ones(batch, dtype=torch.int64)
    op(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, ones, torch.arange(batch), sm_scale,
       share_prefixes, bf16_dot, True, amx)


def has_bf16_dot() -> bool:
    """Whether the built kernel runs a bf16 pool's long blocks in bf16 dot products (AVX512_BF16)."""
    if cpu_attention_op() is None:
        raise RuntimeError(f"the CPU attention kernel is unavailable: {cpu_attention_error()}")
    return torch.ops.vlserve_cpu.has_bf16_dot()


def has_amx() -> bool:
    """Whether the built kernel runs those bf16 blocks on AMX tiles (an Intel Xeon from Sapphire Rapids
    on, and an OS that grants the tile state)."""
    if cpu_attention_op() is None:
        raise RuntimeError(f"the CPU attention kernel is unavailable: {cpu_attention_error()}")
    return torch.ops.vlserve_cpu.has_amx()


def shared_prefix_groups(req_to_token, req_pool_indices, seq_lens, extend_lens=None) -> torch.Tensor:
    """[batch, 2] int64: the group each request's shared-prefix pass would put it in (-1: none) and
    how many leading keys the group shares. Decode rows only (extend_lens None means all ones)."""
    op = cpu_attention_op()
    if op is None:
        raise RuntimeError(f"the CPU attention kernel is unavailable: {cpu_attention_error()}")
    if extend_lens is None:
        extend_lens = torch.ones(req_pool_indices.numel(), dtype=torch.int64)
    return torch.ops.vlserve_cpu.shared_prefix_groups(req_to_token, req_pool_indices, seq_lens, extend_lens)


def extend_attention_cpu(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens,
                         qo_start_loc, sm_scale, bf16_dot: bool = True, causal: bool = True,
                         amx: bool = True, validate: bool = True) -> None:
    """Request b's new tokens q[qo_start_loc[b] : + extend_lens[b]] attend to its cached prefix and
    causally to themselves (causal=False: to all of its seq_lens[b] keys).

    validate=False leaves out the Python checks' ValueErrors, for callers whose tensors the engine
    built (a model layer, ~6 us a call): the kernel still checks every shape and index it follows
    and raises a RuntimeError naming the bad one."""
    op = cpu_attention_op() if q.is_cpu else None
    if op is None:
        return extend_attention_ref(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens,
                                    extend_lens, qo_start_loc, sm_scale, causal=causal)
    if validate:
        check_extend_args(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens,
                          qo_start_loc)
    op(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens, extend_lens, qo_start_loc, sm_scale,
       True, bf16_dot, causal, amx)
