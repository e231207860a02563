"""compressed-tensors checkpoints (as llm-compressor saves them): the config and the tensors.

config.json's `quantization_config` (quant_method "compressed-tensors") names the schemes in
`config_groups`. Two are served, on the decoder's linear layers:
- W8A8 int8 ("int-quantized"): int8 weights, one scale per output channel, symmetric; int8
  activations with one scale per token, computed at run time (dynamic, symmetric). The int8 weight
  keeps the plain name `weight` (told apart by its dtype) beside `weight_scale` [N, 1].
- W4A16 ("pack-quantized"): int4 weights in groups along the input, symmetric or asymmetric;
  activations in full precision. `weight_packed` int32 [N, K/8]: element i of a row sits at bits
  4·(i % 8) of word i // 8, stored as q + 8; `weight_scale` [N, K/G]; `weight_shape` [2];
  asymmetric: `weight_zero_point` int32 [N/8, K/G], its int4 values packed the same way but down the
  output rows.
Anything else (FP8, NVFP4, 2:4 sparsity, transforms, KV-cache quantization, other bit widths) is
refused with a CheckpointError naming it.

Which linear layers are quantized is read from the tensors, not from the config's `ignore` list: that
list is written in checkpoint-key form and does not match module names. A linear is quantized if and
only if its checkpoint has a `weight_scale`.
"""

import json
import os
from dataclasses import dataclass

import torch

from vlserve.core.errors import CheckpointError

QUANT_METHOD = "compressed-tensors"
SUFFIXES = (".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape", ".weight", ".bias")


@dataclass(frozen=True)
class QuantScheme:
    """One served scheme: W8A8 (bits 8, per channel, dynamic per-token int8 activations) or W4A16
    (bits 4, group_size input elements per scale, symmetric or not)."""
    bits: int
    group_size: int | None  # None: one scale per output channel
    symmetric: bool
    int8_activations: bool

    @property
    def name(self) -> str:
        if self.bits == 8:
            return "W8A8-int8"
        return f"W4A16 (group {self.group_size}, {'symmetric' if self.symmetric else 'asymmetric'})"


def read_quant_scheme(path: str) -> QuantScheme | None:
    """The checkpoint's scheme from its config.json; None for a full-precision checkpoint."""
    with open(os.path.join(path, "config.json")) as f:
        qc = json.load(f).get("quantization_config")
    if not qc:
        return None
    try:
        return scheme_from_config(qc)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None


def scheme_from_config(qc: dict) -> QuantScheme:
    method = qc.get("quant_method")
    if method != QUANT_METHOD:
        raise CheckpointError(f"quantization {method!r} is not served; vlserve loads compressed-tensors "
                              "W8A8-int8 and W4A16 checkpoints")
    for key, what in (("sparsity_config", "sparsity"), ("transform_config", "transforms"),
                      ("kv_cache_scheme", "KV-cache quantization")):
        if qc.get(key):
            raise CheckpointError(f"compressed-tensors {what} ({key}: {_short(qc[key])}) is not served; "
                                  "vlserve loads dense W8A8-int8 and W4A16 checkpoints")
    groups = qc.get("config_groups") or {}
    schemes = {_group_scheme(name, g, qc.get("format")) for name, g in groups.items()}
    if len(schemes) != 1:
        raise CheckpointError(f"compressed-tensors config_groups with {len(schemes)} schemes; vlserve serves "
                              "one scheme (W8A8-int8 or W4A16) over the decoder's linear layers")
    return schemes.pop()


def _group_scheme(name: str, group: dict, default_format: str | None) -> QuantScheme:
    w, a = group.get("weights") or {}, group.get("input_activations")
    fmt = group.get("format") or default_format
    desc = (f"config group {name!r} (format {fmt!r}, weights {_short(w)}, "
            f"input_activations {_short(a)}, output_activations {_short(group.get('output_activations'))})")
    if w.get("type") != "int" or group.get("output_activations"):
        raise CheckpointError(f"{desc} is not served: vlserve loads W8A8-int8 and W4A16 (integer) schemes")
    if w.get("num_bits") == 8 and fmt == "int-quantized":
        ok = (w.get("strategy") == "channel" and w.get("symmetric", True) and a is not None
              and a.get("type") == "int" and a.get("num_bits") == 8 and a.get("strategy") == "token"
              and a.get("dynamic") is True and a.get("symmetric", True))
        if ok:
            return QuantScheme(8, None, True, True)
    if w.get("num_bits") == 4 and fmt == "pack-quantized" and a is None and w.get("strategy") == "group":
        return QuantScheme(4, int(w["group_size"]), bool(w.get("symmetric", True)), False)
    raise CheckpointError(f"{desc} is not served: vlserve loads W8A8-int8 (int8 per-channel symmetric weights, "
                          "dynamic per-token int8 activations) and W4A16 (pack-quantized int4 groups)")


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 200 else text[:200] + "..."


def quantized_prefixes(state: dict[str, torch.Tensor]) -> list[str]:
    """The modules the checkpoint quantized: those with a `weight_scale`."""
    return sorted(k[:-len(".weight_scale")] for k in state if k.endswith(".weight_scale"))


def unpack_int4(packed: torch.Tensor, rows: int, cols: int, dim: int = 1) -> torch.Tensor:
    """int32 words of eight int4 values (bits 4·(i % 8) of word i // 8, each stored as q + 8) -> int8
    q in [-8, 7], [rows, cols]; dim 1 packed along a row (weights), dim 0 down the rows (zero points)."""
    words = packed.to(torch.int32)
    if dim == 0:
        words = words.t()
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    # shift first, then mask: a word with its top nibble >= 8 is negative, and >> keeps the sign
    nibbles = (words.unsqueeze(-1) >> shifts) & 0xF
    values = (nibbles.flatten(-2) - 8).to(torch.int8)
    values = values[:, :rows] if dim == 0 else values[:, :cols]
    return values.t().contiguous() if dim == 0 else values.contiguous()


@dataclass
class QuantizedWeight:
    """One linear layer's weight as the checkpoint holds it, unpacked to int8 values."""
    qweight: torch.Tensor  # int8 [N, K]: W8A8 in [-127, 127], W4A16 in [-8, 7]
    scale: torch.Tensor  # fp32 [N, 1] (per channel) or [N, K / group_size]
    zero_point: torch.Tensor | None  # int8 [N, K / group_size] (asymmetric W4A16), else None
    group_size: int | None
    bias: torch.Tensor | None

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """(q - zero point) · scale, per group, as compressed-tensors decompresses it."""
        n, k = self.qweight.shape
        g = self.group_size or k
        q = self.qweight.float().view(n, k // g, g)
        if self.zero_point is not None:
            q = q - self.zero_point.float().unsqueeze(-1)
        return (q * self.scale.float().view(n, k // g, 1)).view(n, k).to(dtype)


def take_quantized_weight(state: dict[str, torch.Tensor], prefix: str, scheme: QuantScheme) -> QuantizedWeight:
    """Pops `prefix`'s tensors out of the checkpoint's state dict; CheckpointError on a bad shape or dtype."""
    get = {s: state.pop(prefix + s, None) for s in SUFFIXES}
    scale, bias = get[".weight_scale"].float(), get[".bias"]
    if scheme.bits == 8:
        w = get[".weight"]
        if w is None or w.dtype != torch.int8 or scale.shape != (w.shape[0], 1):
            raise CheckpointError(f"{prefix}: W8A8 wants an int8 `weight` [N, K] and `weight_scale` [N, 1]; found "
                                  f"weight {_desc(w)}, weight_scale {_desc(scale)}")
        return QuantizedWeight(w, scale, None, None, bias)
    packed, shape = get[".weight_packed"], get[".weight_shape"]
    if packed is None or shape is None or packed.dtype != torch.int32:
        raise CheckpointError(f"{prefix}: W4A16 wants int32 `weight_packed` and `weight_shape`; found "
                              f"weight_packed {_desc(packed)}, weight_shape {_desc(shape)}")
    n, k = (int(v) for v in shape.tolist())
    g = scheme.group_size
    if k % g or scale.shape != (n, k // g) or packed.shape != (n, -(-k // 8)):
        raise CheckpointError(f"{prefix}: W4A16 group {g} does not fit weight_shape [{n}, {k}] "
                              f"(weight_packed {_desc(packed)}, weight_scale {_desc(scale)})")
    zp = get[".weight_zero_point"]
    if not scheme.symmetric:
        if zp is None or zp.shape != (-(-n // 8), k // g):
            raise CheckpointError(f"{prefix}: asymmetric W4A16 wants weight_zero_point [{-(-n // 8)}, {k // g}]; "
                                  f"found {_desc(zp)}")
        zp = unpack_int4(zp, n, k // g, dim=0)
    return QuantizedWeight(unpack_int4(packed, n, k), scale, zp, g, bias)


def _desc(t: torch.Tensor | None) -> str:
    return "missing" if t is None else f"{t.dtype} {list(t.shape)}"
