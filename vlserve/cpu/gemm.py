"""The GEMM path every linear layer takes on the CPU (CpuLinear.path), by row count, dtype and CPU.

Each weight is resident once, in one layout:
- packed (kernels/decode_gemm.py's layout: 16 output columns per 64 bytes at each step of K) wherever
  our kernel runs the dtype here (AVX-512: fp32, and bf16 with AVX512_BF16; AVX2: both). The plain
  tensor is dropped once packed: `weight` is then derived from the packed layout when read (state
  dicts, tensor-parallel sharding), a copy. Rows in PACKED_KERNEL_ROWS run our kernel on it; the
  others (AVX2 and AMX prefills, where oneDNN is faster) run oneDNN on column chunks of the weight
  unpacked per call into a scratch of at most UNPACK_COLUMNS columns ("unpacked").
- plain elsewhere (the kernel not built, an odd K in bf16, --disable-cpu-gemm's nn.Linear): below
  SMALL_ROWS our small-row kernel (vlserve.kernels.small_gemm, fp32, and bf16 without native bf16
  kernels); oneDNN's inner product for fp32 from ONEDNN_MIN_ROWS; bf16 widened to fp32 from
  UPCAST_MIN_ROWS where the CPU lacks native bf16 (AVX2); else F.linear (MKL's gemv at 1-3 rows).

Why: at the few to few dozen rows serving runs, MKL and oneDNN reach a fraction of the core's rate
while the step is bound by streaming the weights, which our kernel reads once per step; on AVX-512
it measured level with or ahead of oneDNN on oneDNN's own blocked layout at every row count up to
2,048 (benchmarks/RESULTS.md, "One resident weight copy"), so that blocked copy, and the plain one
beside it, are no longer kept. A tied embedding reads its rows from the LM head's packed layout
(cpu/tied_embedding.py), so a tied head is packed like any other layer. A weight another module still
holds (a tensor-parallel shard's tied head) keeps its plain tensor there, and its packed layout is an
extra copy: skipped past PACK_MEMORY_SHARE of the memory left, and the start-up log names those layers.
Half-precision oneDNN calls are padded to a few row counts (onednn_rows) so oneDNN builds each
primitive once.
"""

import functools
import logging
import os
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from vlserve.cpu.tied_embedding import tie_embeddings
from vlserve.kernels import decode_gemm, small_gemm

log = logging.getLogger(__name__)

ONEDNN_MIN_ROWS = 4  # below this MKL's gemv / small sgemm was level or faster
SMALL_ROWS = small_gemm.MAX_ROWS  # below this, our small-row kernel (plain weights)
UPCAST_MIN_ROWS = 16  # bf16 without native kernels: from here the fp32 GEMM on a widened weight wins
PACK_MEMORY_SHARE = 0.25  # packed layouts beside a plain weight kept for another module: at most this share
UNPACK_COLUMNS = 1024  # the "unpacked" path's scratch: this many output columns of the weight at a time
ANY_ROWS = range(1, 1 << 62)
# Rows our kernel runs on the packed layout, by the vector width it was built for and the dtype: on
# AVX-512 every count (level with or ahead of oneDNN on its blocked layout from 1 to 2,048 rows, one
# Zen 5 core); on AVX2 (no native bf16) up to where oneDNN on the plain weight catches up.
PACKED_KERNEL_ROWS = {512: {torch.float32: ANY_ROWS, torch.bfloat16: ANY_ROWS},
                      256: {torch.float32: range(1, 129), torch.bfloat16: range(1, 129)}}
# With AMX (Intel Sapphire Rapids and later) oneDNN's bf16 tiles outrun vdpbf16ps from 5 rows up
# (1.6x at 8 rows, 5x at 32 on a Xeon, two threads, weights streamed), so our kernel takes bf16 rows
# there only on AMX tiles of its own (decode_gemm.amx_max_rows(): up to 48), or 1-4 rows in
# vdpbf16ps if its tiles are not granted; larger counts go to oneDNN's tiles on unpacked chunks.
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


@functools.cache
def packed_kernel_rows(dtype: torch.dtype) -> range:
    """The row counts of `dtype` our kernel runs on the packed layout here; empty where it does not
    run `dtype` (not built, or bf16 on AVX-512 without AVX512_BF16): weights of `dtype` stay plain."""
    if not torch.backends.mkldnn.is_available() or decode_gemm.decode_gemm_op(dtype) is None:
        return range(0)
    if dtype == torch.bfloat16 and amx_bf16() and native_bf16():
        return amx_bf16_kernel_rows()
    return PACKED_KERNEL_ROWS.get(decode_gemm.vector_bits(), {}).get(dtype, range(0))


def amx_bf16_kernel_rows() -> range:
    """bf16 rows for our kernel on an AMX CPU: its own tiles' rows, else the few vdpbf16ps wins."""
    tiles = decode_gemm.amx_max_rows()
    return range(1, tiles + 1) if tiles else AMX_BF16_VDP_ROWS


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
    832): there calls go up to a multiple of 16 only, at most 15 zero rows.

    Each cached primitive also keeps scratch memory of its own, growing with its rows: on an AMX Xeon
    ~0.5 MB at up to 256 rows and 7-13 MB at 1-2K rows of a 1,024-column chunk 1,024-4,096 deep. So
    primitives are built on first use, never ahead: building every count up to 1,024 rows at load held
    110 MB of a bf16 server on a 100 M-parameter model (tests/test_memory_budget.py's), a third of its
    weights, for ~26 ms saved at each count's first prefill."""
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


@dataclass
class PackReport:
    """What pack_weights did: bytes of the layers' one resident layout, bytes of packed layouts kept
    beside a plain weight another module holds, and the layers left plain with why and the cost."""

    packed_bytes: int = 0
    extra_bytes: int = 0
    plain: list[tuple[str, str]] = field(default_factory=list)  # (layer, reason)
    tied: list[str] = field(default_factory=list)  # embeddings reading a tied head's packed layout


class CpuLinear(nn.Linear):
    """nn.Linear with the measured CPU GEMM path and one resident layout of its weight (packed where
    our kernel runs its dtype); same state-dict keys."""

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

    @property
    def weight(self) -> torch.Tensor:
        """The plain [out, in] weight: the parameter; once packed, the parameter it was packed from while
        another module holds it (a tied embedding: tied weights stay one object), else a copy derived
        from the packed layout. Assign a new weight to change it: the packed layout does not follow
        an in-place change."""
        param = self._parameters.get("weight")
        if param is not None:
            return param
        packed = self.__dict__.get("_packed")
        if packed is None:
            raise AttributeError("weight")
        held = self.__dict__["_dropped"]()  # the plain parameter, where another module still holds it
        if held is not None:
            return held
        return decode_gemm.unpack(packed, self.out_features, self.in_features, self.__dict__["_dtype"])

    def __setattr__(self, name: str, value) -> None:
        if name == "weight":  # a new plain weight replaces the packed layout; packed again at first use
            self.__dict__.pop("_packed", None)
            self.__dict__["pack_on_use"] = True
        super().__setattr__(name, value)

    @property
    def packed(self) -> torch.Tensor | None:
        """The weight in kernels/decode_gemm.py's layout, or None while it is plain."""
        return self.__dict__.get("_packed")

    def weight_dtype(self) -> torch.dtype:
        return self.__dict__["_dtype"] if self.packed is not None else self._parameters["weight"].dtype

    def packable(self) -> bool:
        """Whether our kernel runs this weight here (its dtype, a CPU tensor, bf16's K even)."""
        w = self._parameters.get("weight")
        if w is None or not w.is_cpu or w.dim() != 2 or not packed_kernel_rows(w.dtype):
            return False
        return w.dtype != torch.bfloat16 or w.shape[1] % 2 == 0

    def pack(self) -> int:
        """Packs the weight into our kernel's layout and drops the plain parameter; returns the packed
        bytes (0: not packable, or packed already)."""
        self.pack_on_use = False
        if self.packed is not None or not self.packable():
            return 0
        w = self._parameters["weight"]
        with torch.no_grad():
            packed = decode_gemm.pack(w.detach())
        del self._parameters["weight"]
        self.__dict__["_dropped"] = weakref.ref(w)
        self.__dict__["_dtype"] = w.dtype
        self.__dict__["_packed"] = packed
        return packed.numel() * packed.element_size()

    def follow_replaced(self, replaced: dict[int, torch.Tensor]) -> None:
        """The parameter this weight was packed from, held by another module, was replaced there by
        replaced[id(old)] (the loader's copies out of the checkpoint's mapping): `weight` gives that."""
        held = self.__dict__.get("_dropped", lambda: None)()
        if held is not None and id(held) in replaced:
            self.__dict__["_dropped"] = weakref.ref(replaced[id(held)])

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.packed is not None:
            destination[prefix + "weight"] = self.weight

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        weight = state_dict.pop(prefix + "weight", None) if self.packed is not None else None
        if weight is not None:
            if tuple(weight.shape) != (self.out_features, self.in_features):
                error_msgs.append(f"size mismatch for {prefix}weight: {tuple(weight.shape)} in the state dict, "
                                  f"{(self.out_features, self.in_features)} here")
            else:
                self.weight = nn.Parameter(weight.to(self.weight_dtype()), requires_grad=False)
                self.pack()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cpu or x.dim() == 0:
            return F.linear(x, self.weight, self.bias)
        if self.packed is None and self.__dict__.get("pack_on_use", True):
            self.pack()  # a layer made after load (a tensor-parallel shard) or given a new weight
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        path = self.path(rows, x.dtype)
        if path == "packed":
            return decode_gemm.linear(x, self.packed, self.out_features, self.bias)
        if path == "unpacked":
            return self._unpacked_linear(x, rows)
        return _plain_linear(path, x, self.weight, self.bias)

    def path(self, rows: int, dtype: torch.dtype) -> str:
        """Where `rows` rows of `dtype` go: "packed" (our kernel on the packed layout), "unpacked"
        (oneDNN on the packed layout's column chunks unpacked per call), or for a plain weight "small"
        (the small-row kernel), "onednn" (oneDNN on the plain weight), "upcast" (oneDNN in fp32 on a
        widened bf16 weight) or "torch" (F.linear)."""
        if self.packed is not None and self.__dict__["_dtype"] == dtype:
            return "packed" if rows in packed_kernel_rows(dtype) else "unpacked"
        return plain_path(rows, dtype, self.weight.dtype, self.use_small_gemm)

    def _unpacked_linear(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """oneDNN over the weight's columns, UNPACK_COLUMNS at a time, each unpacked for this call."""
        flat = x.reshape(rows, self.in_features)
        dtype = self.__dict__["_dtype"]
        y = x.new_empty(rows, self.out_features)
        for first in range(0, self.out_features, UNPACK_COLUMNS):
            cols = range(first, min(first + UNPACK_COLUMNS, self.out_features))
            w = decode_gemm.unpack(self.packed, self.out_features, self.in_features, dtype, cols)
            bias = None if self.bias is None else self.bias[cols.start:cols.stop]
            y[:, cols.start:cols.stop] = _plain_linear(plain_path(rows, dtype, dtype, False), flat, w, bias)
        return y.view(*x.shape[:-1], self.out_features)


def plain_path(rows: int, dtype: torch.dtype, weight_dtype: torch.dtype, use_small_gemm: bool) -> str:
    """CpuLinear.path for a plain weight of weight_dtype."""
    if 0 < rows < SMALL_ROWS and dtype in (torch.float32, torch.bfloat16) and weight_dtype == dtype:
        if use_small_gemm and small_gemm.small_linear_op() is not None:
            if dtype == torch.float32 or not native_bf16():
                return "small"
    if dtype == torch.float32 and weight_dtype == torch.float32:
        if rows >= ONEDNN_MIN_ROWS:
            return "onednn"
    elif dtype == torch.bfloat16 and weight_dtype == dtype and rows >= UPCAST_MIN_ROWS and not native_bf16():
        return "upcast"
    elif dtype == torch.bfloat16 and weight_dtype == dtype and native_bf16():
        return "onednn"
    return "torch"


def _plain_linear(path: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if path == "small":
        return small_gemm.small_linear_op()(x.float(), weight, bias).to(x.dtype)
    if path == "onednn":
        return _onednn(x, weight, bias)
    if path == "upcast":
        return _onednn(x.float(), weight.float(), None if bias is None else bias.float()).to(torch.bfloat16)
    return F.linear(x, weight, bias)


def use_cpu_gemm(model: nn.Module, use_small_gemm: bool = True) -> nn.Module:
    """Replaces every plain nn.Linear in `model` (decoder, projector, vision tower) by a CpuLinear
    holding its parameters, and an embedding tied to one of them by a lookup in its packed layout
    (PackedRowsEmbedding), then packs them; returns the model (a bare nn.Linear: its
    CpuLinear). A no-op without oneDNN. The packing's report is kept on the model as
    `cpu_gemm_report` (the engine's start-up memory report reads it)."""
    if not torch.backends.mkldnn.is_available():
        return model
    if type(model) is nn.Linear:
        model = CpuLinear.from_linear(model, use_small_gemm)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                setattr(parent, name, CpuLinear.from_linear(child, use_small_gemm))
    layers = {name: m for name, m in model.named_modules() if isinstance(m, CpuLinear)}
    tied = tie_embeddings(model, list(layers.values()))  # a tied embedding reads the head's packed rows
    held = {id(p) for m in model.modules() if not isinstance(m, CpuLinear) for p in m.parameters(recurse=False)}
    report = pack_weights(layers, shared=held)
    report.tied = tied
    if tied:
        log.info("CPU GEMM: %s read their rows from the tied LM head's packed layout (one copy)", ", ".join(tied))
    model.__dict__["cpu_gemm_report"] = report
    return model


def pack_weights(layers: dict[str, CpuLinear], shared: set[int] = frozenset(),
                 free_bytes: int | None = None) -> PackReport:
    """Packs each layer's weight into our kernel's layout, dropping the plain tensor (one resident
    copy, no extra memory beyond one layer's while it packs). A weight another module also holds (ids
    in `shared`: a tied LM head's embedding) keeps its plain tensor there, so its packed layout is an
    extra copy: those are packed only while they fit in PACK_MEMORY_SHARE of the free memory, and the
    layers left plain are logged with what it costs."""
    report = PackReport()
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if free_bytes is None else free_bytes
    for name, m in layers.items():
        if m.packed is not None:
            report.packed_bytes += m.packed.numel() * m.packed.element_size()
            continue
        w = m._parameters.get("weight")
        if w is None or not m.packable():
            dtype = None if w is None else w.dtype
            report.plain.append((name, f"our kernel does not run {dtype} weights of {m.in_features} inputs here"))
            continue
        if id(w) in shared:
            size = decode_gemm.packed_bytes(m.out_features, m.in_features, w.dtype)
            if report.extra_bytes + size > PACK_MEMORY_SHARE * free:
                report.plain.append((name, f"its weight is shared with another module and a packed copy "
                                           f"({size / 1e6:.0f} MB) would pass {PACK_MEMORY_SHARE:.0%} of the "
                                           f"{free / 1e9:.1f} GB free"))
                m.pack_on_use = False
                continue
            report.extra_bytes += m.pack()
        else:
            report.packed_bytes += m.pack()
    if report.plain:
        log.warning("CPU GEMM: %d linear layers keep a plain weight and run the slower plain path (oneDNN / MKL: "
                    "about 1.2-2.5x slower at decode sizes): %s", len(report.plain),
                    "; ".join(f"{n or 'the model'}: {why}" for n, why in report.plain))
    return report
