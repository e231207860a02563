"""Linear layers on compressed-tensors weights (model/compressed_tensors.py reads them).

- Int8Linear (W8A8): each call quantizes its input per row and runs the int8 GEMM
  (kernels/quant_gemm.py: AVX512-VNNI or AVX2); or takes rows the norm before it quantized
  (QuantizedRows: q/k/v and gate/up, whose inputs are an RMSNorm's output).
- Int4Linear (W4A16): rows fewer than INT4_PREFILL_ROWS run the kernel that unpacks and
  scales the int4 weight in registers; prefill rows unpack it to the input's dtype once per call and
  run BLAS on it.
The kernels' weights are packed once at load (pack_quantized_linears); the checkpoint's int8 values
are then let go, so one copy of each weight stays resident. Where the kernels are not built the
PyTorch references run on the checkpoint's values.

On a GPU there are no quantized kernels: apply_compressed_tensors dequantizes the weights at load
into the model's dtype, and says so in the log. Outputs are in the input's dtype; nothing of these
layers is in the model's state dict (the checkpoint's tensors are read here, not by
load_state_dict).
"""

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vlserve.core.errors import CheckpointError
from vlserve.kernels import quant_gemm
from vlserve.model.compressed_tensors import (
    QuantizedWeight, QuantScheme, quantized_prefixes, read_quant_scheme, take_quantized_weight,
)

log = logging.getLogger(__name__)

# From this many rows a W4A16 layer unpacks its weight to bf16 and runs BLAS on it: measured on an
# 8192 x 1536 layer (one Zen thread, CPU time), the in-register kernel took 5.3 ms at 8 rows against
# 36 for unpacking + BLAS (oneDNN pays for a weight it has not seen), level at 128 rows (64 ms each),
# and 123 against 87 at 256.
INT4_PREFILL_ROWS = 128


@dataclass
class QuantizedRows:
    """A W8A8 layer's input already quantized per row, by the norm before it (llama.py's
    RMSNorm.quantized): int8 rows [T, K rounded up to 4], fp32 scales [T], and the dtype of the float
    rows they stand for (the layer's output dtype)."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


class QuantizedLinear(nn.Module):
    """A linear layer whose weight is a QuantizedWeight; y = x · wᵀ (+ bias) in x's dtype."""

    def __init__(self, weight: QuantizedWeight, scheme: QuantScheme):
        super().__init__()
        self.out_features, self.in_features = weight.qweight.shape
        self.scheme = scheme
        self.weight_q: QuantizedWeight | None = weight  # the checkpoint's values until packed
        self.register_buffer("bias", weight.bias, persistent=False)
        self.packed: tuple[torch.Tensor, ...] | None = None  # the kernel's copy (pack)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.scheme.name}"

    def pack(self) -> None:
        """Packs the weight for the kernel (where it runs here) and lets the unpacked values go; the
        bias becomes fp32, as the kernels' epilogues read it (not converted at every call)."""
        if self.packed is None and self.kernel_runs():
            self.packed = self.pack_weight(self.weight_q)
            self.weight_q = None
            if self.bias is not None:
                self.bias = self.bias.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            self.pack()
        if x.dim() == 2 and self.packed is not None:  # the engine's flat [T, hidden] rows, as they are
            y = self.kernel(x)
            return y if y.dtype == x.dtype else y.to(x.dtype)
        x2 = x.reshape(-1, self.in_features)
        y = self.kernel(x2) if self.packed is not None else self.reference(x2)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def kernel_runs(self) -> bool:
        raise NotImplementedError

    def pack_weight(self, weight: QuantizedWeight) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Int8Linear(QuantizedLinear):
    """W8A8-int8: int8 weights per output channel, the input quantized per row at each call."""

    def forward(self, x: torch.Tensor | QuantizedRows) -> torch.Tensor:
        if not isinstance(x, QuantizedRows):
            return super().forward(x)
        packed, comp, scale = self.packed
        y = quant_gemm.int8_linear_quantized(x.q, x.scale, packed, comp, scale, self.bias, x.dtype == torch.bfloat16)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def reads_quantized_rows(self) -> bool:
        """Whether forward takes QuantizedRows: the weight packed for the kernel."""
        return self.packed is not None

    def kernel_runs(self) -> bool:
        return quant_gemm.int8_isa() > 0

    def pack_weight(self, weight: QuantizedWeight) -> tuple[torch.Tensor, ...]:
        packed, comp = quant_gemm.pack_int8(weight.qweight)
        return packed, comp, weight.scale.view(-1).float().contiguous()

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        packed, comp, scale = self.packed
        return quant_gemm.int8_linear(x, packed, comp, scale, self.bias)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return quant_gemm.int8_linear_ref(x, self.weight_q.qweight, self.weight_q.scale.view(-1), self.bias)


class Int4Linear(QuantizedLinear):
    """W4A16: int4 groups along the input, symmetric or with zero points; the input stays float."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.packed
        if packed is not None and x.dim() == 2 and x.shape[0] < INT4_PREFILL_ROWS:  # decode rows: the kernel at once
            y = quant_gemm.int4_decode(x, packed[0], packed[1], self.bias, self.out_features)
            return y if y.dtype == x.dtype else y.to(x.dtype)
        return super().forward(x)

    def kernel_runs(self) -> bool:
        return quant_gemm.int4_supported()

    def pack_weight(self, weight: QuantizedWeight) -> tuple[torch.Tensor, ...]:
        return quant_gemm.pack_int4(weight.qweight, weight.scale, weight.zero_point)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        packed, sc = self.packed
        if x.shape[0] < INT4_PREFILL_ROWS:
            return quant_gemm.int4_decode(x, packed, sc, self.bias, self.out_features)
        w = quant_gemm.int4_dequantize(packed, sc, self.out_features, x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight_q.dequantize(x.dtype), bias)


LAYERS = {8: Int8Linear, 4: Int4Linear}


def fuse_quantized(parts: list[nn.Module]) -> QuantizedLinear:
    """One layer for `parts` stacked along the output rows (q, k, v; gate, up), before packing."""
    if not all(isinstance(p, QuantizedLinear) and p.weight_q is not None for p in parts):
        kinds = [type(p).__name__ for p in parts]
        raise CheckpointError(f"cannot fuse projections of mixed precision {kinds}: a compressed-tensors checkpoint "
                              "quantizes all of a layer's q/k/v (and gate/up) projections or none")
    ws = [p.weight_q for p in parts]
    biases = [w.bias for w in ws]
    fused = QuantizedWeight(
        torch.cat([w.qweight for w in ws]), torch.cat([w.scale for w in ws]),
        None if ws[0].zero_point is None else torch.cat([w.zero_point for w in ws]),
        ws[0].group_size, None if biases[0] is None else torch.cat(biases))
    return type(parts[0])(fused, parts[0].scheme)


def apply_compressed_tensors(path: str, model: nn.Module, state: dict[str, torch.Tensor],
                             device: str | torch.device, dtype: torch.dtype) -> QuantScheme | None:
    """For a compressed-tensors checkpoint: every linear with a `weight_scale` in `state` becomes a
    quantized layer (its tensors taken out of `state`), or on a GPU its weight is dequantized into
    `state` as `weight`. Returns the scheme (None: a full-precision checkpoint, nothing done)."""
    scheme = read_quant_scheme(path)
    if scheme is None:
        return None
    prefixes = quantized_prefixes(state)
    modules = dict(model.named_modules())
    not_linear = [p for p in prefixes if not isinstance(modules.get(p), nn.Linear)]
    if not_linear:
        raise CheckpointError(f"{path}: quantized weights for modules that are not linear layers here: "
                              f"{not_linear[:8]}")
    on_cpu = torch.device(device).type == "cpu"
    for prefix in prefixes:
        weight = take_quantized_weight(state, prefix, scheme)
        if on_cpu:
            parent, _, name = prefix.rpartition(".")
            setattr(modules[parent], name, LAYERS[scheme.bits](weight, scheme))
        else:
            state[prefix + ".weight"] = weight.dequantize(dtype)
            if weight.bias is not None:
                state[prefix + ".bias"] = weight.bias.to(dtype)
    where = ("on the CPU's int8/int4 kernels" if on_cpu else
             f"dequantized at load to {dtype} on {device} (no quantized GPU kernels: full-precision speed and memory)")
    log.info("compressed-tensors %s: %d linear layers quantized, %s", scheme.name, len(prefixes), where)
    return scheme


def pack_quantized_linears(model: nn.Module) -> int:
    """Packs every quantized layer's weight for its kernel now (after the projections are fused);
    returns the layers packed."""
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    for m in layers:
        m.pack()
    return sum(m.packed is not None for m in layers)
