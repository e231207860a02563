"""The GEMM path every linear layer takes on the CPU (CpuLinear.path), by row count, dtype and CPU.

In order: decode batches (DECODE_GEMM_ROWS) go to our decode-rows kernel on a packed copy of the
weight (vlserve.kernels.decode_gemm; bf16 on AMX tiles where the CPU has AMX); on AVX-512, oneDNN on a
weight packed once at load (fp32 from PACKED_MIN_ROWS rows, bf16 at every size); below SMALL_ROWS our
small-row kernel (vlserve.kernels.small_gemm, fp32, and bf16 without native bf16 kernels); oneDNN's
inner product on the plain weight for fp32 from ONEDNN_MIN_ROWS; bf16 widened to fp32 from
UPCAST_MIN_ROWS where the CPU lacks native bf16 (AVX2); else F.linear (MKL's gemv at 1-3 rows).

Why: at the few to few dozen rows serving runs, MKL and oneDNN reach a fraction of the core's rate
while the step is bound by streaming the weights, which our kernels read once per step; oneDNN wins
at prefill sizes, fastest on its own blocked layout. Half-precision oneDNN calls are padded to a few
row counts (onednn_rows) so oneDNN builds each primitive once. The plain weight stays the parameter
(state dicts, tied embeddings and the small-row kernel read it); packed copies are rebuilt if it
changes, and skipped, with a warning, past PACK_MEMORY_SHARE of the memory left. The measurements
behind each threshold: benchmarks/RESULTS.md, "CPU kernels".
"""

import functools
import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

from vlserve.kernels import decode_gemm, small_gemm

log = logging.getLogger(__name__)

ONEDNN_MIN_ROWS = 4  # below this MKL's gemv / small sgemm was level or faster
SMALL_ROWS = small_gemm.MAX_ROWS  # below this, our small-row kernel
UPCAST_MIN_ROWS = 16  # bf16 without native kernels: from here the fp32 GEMM on a widened weight wins
PACKED_MIN_ROWS = {torch.float32: 4, torch.bfloat16: 1}  # AVX-512: below 4 fp32 rows our kernel still wins
PACK_MEMORY_SHARE = 0.25  # packed copies may take at most this share of the memory left at load
PACK_HINT_ROWS = 32  # the batch size oneDNN picks the blocked layout for (1-2048 measured level from 4 rows)
# Rows that go to our kernel on its own packed copy (kernels/decode_gemm.py), by the vector width it
# was built for and the dtype: on AVX-512 the decode batches where oneDNN's packed path ran at 60-70%
# of its prefill rate; on AVX2 (no packed path, no native bf16) up to where oneDNN catches up.
DECODE_GEMM_ROWS = {512: {torch.float32: range(8, 65), torch.bfloat16: range(8, 65)},
                    256: {torch.float32: range(8, 129), torch.bfloat16: range(1, 129)}}
# With AMX (Intel Sapphire Rapids and later) oneDNN's bf16 tiles outrun vdpbf16ps from 5 rows up
# (1.6x at 8 rows, 5x at 32 on a Xeon, two threads, weights streamed), so our kernel takes bf16 rows
# there only on AMX tiles of its own (decode_gemm.amx_max_rows(): up to 48), or 1-4 rows in
# vdpbf16ps if its tiles are not granted. fp32 has no AMX path and keeps the AVX-512 rows.
AMX_BF16_VDP_ROWS = range(1, 5)


@functools.cache
def native_bf16() -> bool:
    """Whether oneDNN has bf16 GEMM kernels on this CPU (AVX512_BF16, AVX512-BW or AMX)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@functools.cache
def amx_bf16() -> bool:
    """Whether the CPU has AMX tiles for bf16 (and the kernel lets programs use them: Linux lists the
    flag only then)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return {"amx_bf16", "amx_tile"} <= set(flags.split())


@functools.cache
def native_fp16() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_fp16_supported()


def decode_weights_pay(dtype: torch.dtype) -> bool:
    """Whether some rows of `dtype` take kernels/decode_gemm.py here: it is built for this CPU (AVX-512
    or AVX2) and runs `dtype` (bf16 on AVX-512 needs AVX512_BF16), and oneDNN is there beside it."""
    return bool(decode_gemm_rows(dtype))


@functools.cache
def decode_gemm_rows(dtype: torch.dtype) -> range:
    """The row counts of `dtype` that take kernels/decode_gemm.py on this CPU (empty: none)."""
    if not torch.backends.mkldnn.is_available() or decode_gemm.decode_gemm_op(dtype) is None:
        return range(0)
    if dtype == torch.bfloat16 and amx_bf16() and native_bf16():
        return amx_bf16_decode_rows()
    return DECODE_GEMM_ROWS.get(decode_gemm.vector_bits(), {}).get(dtype, range(0))


def amx_bf16_decode_rows() -> range:
    """bf16 rows for our kernel on an AMX CPU: its own tiles' rows, else the few vdpbf16ps wins."""
    tiles = decode_gemm.amx_max_rows()
    return range(1, tiles + 1) if tiles else AMX_BF16_VDP_ROWS


@functools.cache
def packed_weights_pay(dtype: torch.dtype) -> bool:
    """Whether oneDNN on a packed weight is the fast path for `dtype` on this CPU: AVX-512 (measured
    on an AMD EPYC; on AVX2 packing measured no faster than the plain weight), and for bf16 native
    kernels."""
    if not torch.backends.mkldnn.is_available() or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and native_bf16())


def onednn_rows(rows: int, coarse: bool | None = None) -> int:
    """The row count a half-precision oneDNN call is padded to. oneDNN builds (and JIT-compiles) a
    primitive for every new shape and caches it. Where the CPU has AMX (`coarse`, the default there)
    the build is dear: on an AMX Xeon a bf16 linear with a row count it had not seen took 7.1-11 ms
    against 0.5-1.4 ms (fp32 ~4 against ~2.8), and serving meets a new count at nearly every prefill
    (every layer type's first layer paid it: ~26 ms a bf16 forward). There calls are rounded up to a
    multiple of 16 (to 256 rows), then of an eighth of the power of two below (32 to 512, 64 to
    1,024, ...): eight counts per doubling, each built once, for at most 1/8 more rows of arithmetic
    (the padding rows are zeros, their outputs dropped). Without AMX (AVX512_BF16) a new count's
    build is ~1 ms a layer shape and oneDNN's rate is level at any count (a Zen 4 EPYC, two threads,
    400-420 GFLOP/s from 520 to 1,152 rows: benchmarks/onednn_shapes.py at ba1d303), while the coarse
    counts' padding cost 5-12% of a prefill's arithmetic (few_shot's 520 and 784 rows ran as 576 and
    832): there calls go up to a multiple of 16 only, at most 15 zero rows."""
    if coarse is None:
        coarse = amx_bf16()
    step = max(16, (1 << ((rows - 1).bit_length() - 1)) // 8) if coarse and rows > 1 else 16
    return -(-rows // step) * step


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's linear; half-precision calls padded to onednn_rows (fp32's primitives build in ~1 ms,
    about what the padding's copy and extra rows cost: benchmarks/onednn_shapes.py at ba1d303)."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    padded = rows if x.dtype == torch.float32 else onednn_rows(rows)
    if padded == rows:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    y = torch.ops.mkldnn._linear_pointwise(pad_rows(x.reshape(rows, k), padded), weight, bias, "none", [], "")
    return y[:rows].view(*x.shape[:-1], y.shape[-1])


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """[n, k] -> [rows, k]: x, then zero rows."""
    out = x.new_empty(rows, x.shape[1])
    out[:x.shape[0]].copy_(x)
    out[x.shape[0]:].zero_()
    return out


class CpuLinear(nn.Linear):
    """nn.Linear with the measured CPU GEMM path; same parameters and state-dict keys."""

    use_small_gemm = True  # KernelConfig.small_gemm: off, the small-row kernel's rows go to oneDNN / MKL

    @classmethod
    def from_linear(cls, linear: nn.Linear, use_small_gemm: bool = True) -> "CpuLinear":
        """A CpuLinear holding `linear`'s own parameters (shared, not copied: tied weights stay tied)."""
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta", dtype=w.dtype)
        layer.weight, layer.bias = linear.weight, linear.bias
        layer.train(linear.training)
        layer.use_small_gemm = use_small_gemm
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cpu or x.dim() == 0:
            return F.linear(x, self.weight, self.bias)
        path = self.path(x.numel() // x.shape[-1] if x.shape[-1] else 0, x.dtype)
        if path == "decode":
            return decode_gemm.linear(x, self.decode_weight(), self.out_features, self.bias)
        if path == "packed":
            return _onednn(x, self.packed_weight(), self.bias)
        if path == "small":
            return small_gemm.small_linear_op()(x.float(), self.weight, self.bias).to(x.dtype)
        if path == "onednn":
            return _onednn(x, self.weight, self.bias)
        if path == "upcast":
            bias = None if self.bias is None else self.bias.float()
            return _onednn(x.float(), self.weight.float(), bias).to(torch.bfloat16)
        return F.linear(x, self.weight, self.bias)

    def path(self, rows: int, dtype: torch.dtype) -> str:
        """Where `rows` rows of `dtype` go: "decode" (our decode-rows kernel), "packed" (oneDNN on the
        packed weight), "small" (the small-row kernel), "onednn" (oneDNN on the plain weight),
        "upcast" (oneDNN in fp32 on a widened bf16 weight) or "torch" (F.linear)."""
        packs = self.__dict__.get("pack", True) and self.weight.dtype == dtype
        if packs and rows in decode_gemm_rows(dtype):
            return "decode"
        if packs and rows >= PACKED_MIN_ROWS.get(dtype, 1 << 62) and packed_weights_pay(dtype):
            return "packed"
        if 0 < rows < SMALL_ROWS and dtype in (torch.float32, torch.bfloat16) and self.weight.dtype == dtype:
            if self.use_small_gemm and small_gemm.small_linear_op() is not None:
                if dtype == torch.float32 or not native_bf16():
                    return "small"
        if dtype == torch.float32 and self.weight.dtype == torch.float32:
            if rows >= ONEDNN_MIN_ROWS:
                return "onednn"
        elif dtype == torch.bfloat16 and rows >= UPCAST_MIN_ROWS and not native_bf16():
            return "upcast"
        return "torch"

    def packed_weight(self) -> torch.Tensor:
        """The weight in oneDNN's blocked layout (an opaque MkldnnCPU tensor), packed on first use and
        again whenever the parameter is replaced or changed in place."""
        return self._copy("_packed", lambda w: torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT_ROWS))

    def decode_weight(self) -> torch.Tensor:
        """The weight packed for kernels/decode_gemm.py; kept and rebuilt like packed_weight."""
        return self._copy("_decode_packed", decode_gemm.pack)

    def _copy(self, slot: str, make) -> torch.Tensor:
        key = (id(self.weight), self.weight._version, self.weight.data_ptr())
        cached = self.__dict__.get(slot)
        if cached is None or cached[0] != key:
            with torch.no_grad():
                cached = (key, make(self.weight.detach()))
            self.__dict__[slot] = cached
        return cached[1]


def use_cpu_gemm(model: nn.Module, use_small_gemm: bool = True) -> nn.Module:
    """Replaces every plain nn.Linear in `model` (decoder, projector, vision tower) by a CpuLinear
    holding its parameters, then packs and warms them; returns the model (a bare nn.Linear: its
    CpuLinear). A no-op without oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return model
    if type(model) is nn.Linear:
        model = CpuLinear.from_linear(model, use_small_gemm)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                setattr(parent, name, CpuLinear.from_linear(child, use_small_gemm))
    layers = [m for m in model.modules() if isinstance(m, CpuLinear)]
    pack_weights(layers)
    warm_onednn(layers)
    return model


WARM_ROWS = 1024  # oneDNN's primitives are built at load for every padded row count up to this
# ... where the call's arithmetic is at most this: building a primitive took ~4-10 ms, so a warm-up
# call much bigger than that costs more at load than its build saves later (a 7B model's MLP at a
# few hundred rows is a second of arithmetic on two cores; its prefills dwarf the build anyway)
WARM_MAX_FLOP = 4e9


def warm_onednn(layers: list[CpuLinear], max_rows: int = WARM_ROWS) -> int:
    """Runs one bf16 layer of each shape once at every padded row count (onednn_rows) up to max_rows
    that the layer sends to oneDNN, so that the first prefills of each length find their primitives
    built (see onednn_rows); returns the calls made. bf16 only, and only where the CPU has AMX: its
    AMX primitives are the costly ones to build (the benchmark model's five decoder and four vision
    tower shapes: ~1 s at load), while fp32's, and bf16's on AVX512_BF16 without AMX, cost little
    more to build than to run (fp32: 1.05 s to warm, 0.97 s of it arithmetic) and are left to their
    first use. Larger counts, and calls of more than WARM_MAX_FLOP, are built on first use."""
    if not amx_bf16():
        return 0
    seen, calls = set(), 0
    with torch.inference_mode():
        for m in layers:
            key = (m.in_features, m.out_features, m.weight.dtype, m.bias is not None, m.__dict__.get("pack", True))
            if key in seen or not m.weight.is_cpu or m.weight.dtype != torch.bfloat16 or not native_bf16():
                continue
            seen.add(key)
            for rows in sorted({onednn_rows(r) for r in range(1, max_rows + 1)}):
                if 2 * rows * m.in_features * m.out_features > WARM_MAX_FLOP:
                    break
                if _goes_to_onednn(m, rows):
                    m(torch.zeros(rows, m.in_features, dtype=m.weight.dtype))
                    calls += 1
    return calls


def _goes_to_onednn(m: CpuLinear, rows: int) -> bool:
    """Whether CpuLinear.forward sends `rows` rows of the weight's dtype to oneDNN."""
    return m.path(rows, m.weight.dtype) in ("packed", "onednn", "upcast")


def pack_weights(layers: list[CpuLinear], free_bytes: int | None = None) -> int:
    """Packs the layers' weights now, where packing pays and the copies fit (see the module's
    docstring); returns the bytes packed. Layers left unpacked run on their plain weight."""
    payable = [m for m in layers if packed_weights_pay(m.weight.dtype)]
    decode = [m for m in layers if decode_weights_pay(m.weight.dtype)]
    extra = sum(m.weight.numel() * m.weight.element_size() for m in payable + decode)
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if free_bytes is None else free_bytes
    if extra > PACK_MEMORY_SHARE * free:
        log.warning("CPU GEMM: not packing %.1f GB of weight copies (for oneDNN and the decode-rows kernel; %.1f GB of "
                    "memory free); the linear layers run on their plain weights, about 1.2-2.5x slower at decode sizes",
                    extra / 1e9, free / 1e9)
        for m in payable + decode:
            m.pack = False
        return 0
    for m in payable:
        m.pack = True
        m.packed_weight()
    for m in decode:
        m.decode_weight()
    return extra
