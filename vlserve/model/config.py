"""What vlserve needs to know about a LLaVA checkpoint, read through transformers' own config classes."""

from dataclasses import dataclass
from typing import Any

import torch

from vlserve.core.errors import CheckpointError

SUPPORTED_ARCHITECTURES = ("LlavaForConditionalGeneration",)
SUPPORTED_VISION_MODELS = ("clip_vision_model",)
SUPPORTED_TEXT_MODELS = ("llama",)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class TextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: tuple[int, ...]
    hf_config: Any  # transformers' text config, for RoPE initialisation


@dataclass(frozen=True)
class ModelConfig:
    text: TextConfig
    vision_hf_config: Any  # transformers' CLIPVisionConfig
    image_token_id: int
    vision_feature_layer: int | tuple[int, ...]
    vision_feature_select_strategy: str  # "default" drops CLS, "full" keeps it
    projector_hidden_act: str
    projector_bias: bool
    image_size: int
    patch_size: int
    dtype: torch.dtype

    @property
    def tokens_per_image(self) -> int:
        n = (self.image_size // self.patch_size) ** 2
        return n if self.vision_feature_select_strategy == "default" else n + 1


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_dtype(name: str | torch.dtype | None, default: torch.dtype = torch.float32) -> torch.dtype:
    if name is None or name == "auto":
        return default
    if isinstance(name, torch.dtype):
        return name
    name = str(name).replace("torch.", "")
    if name not in _DTYPES:
        raise CheckpointError(f"unsupported dtype {name!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def model_config_from_hf(hf) -> ModelConfig:
    """Builds a ModelConfig from a transformers LlavaConfig, rejecting what the native model lacks."""
    archs = getattr(hf, "architectures", None) or ["LlavaForConditionalGeneration"]
    if hf.model_type != "llava" or not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise CheckpointError(
            f"unsupported architecture {archs} (model_type {hf.model_type!r}); "
            f"vlserve serves {', '.join(SUPPORTED_ARCHITECTURES)}")
    tc, vc = hf.text_config, hf.vision_config
    if tc.model_type not in SUPPORTED_TEXT_MODELS:
        raise CheckpointError(f"unsupported text model {tc.model_type!r}; supported: {SUPPORTED_TEXT_MODELS}")
    if vc.model_type not in SUPPORTED_VISION_MODELS:
        raise CheckpointError(f"unsupported vision tower {vc.model_type!r}; supported: {SUPPORTED_VISION_MODELS}")
    rope = getattr(tc, "rope_parameters", None) or {"rope_type": "default"}
    if rope.get("rope_type", "default") not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(f"unsupported rope_type {rope.get('rope_type')!r}; supported: {SUPPORTED_ROPE_TYPES}")
    strategy = hf.vision_feature_select_strategy
    if strategy not in ("default", "full"):
        raise CheckpointError(f"unsupported vision_feature_select_strategy {strategy!r}")
    eos = tc.eos_token_id if tc.eos_token_id is not None else getattr(hf, "eos_token_id", None)
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    layer = hf.vision_feature_layer
    text = TextConfig(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_layers=tc.num_hidden_layers, num_heads=tc.num_attention_heads,
        num_kv_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
        head_dim=head_dim, rms_norm_eps=tc.rms_norm_eps,
        max_position_embeddings=tc.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False) or getattr(tc, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(tc, "attention_bias", False)),
        eos_token_ids=eos_ids, hf_config=tc)
    return ModelConfig(
        text=text, vision_hf_config=vc, image_token_id=hf.image_token_id,
        vision_feature_layer=layer if isinstance(layer, int) else tuple(layer),
        vision_feature_select_strategy=strategy,
        projector_hidden_act=getattr(hf, "projector_hidden_act", "gelu"),
        projector_bias=bool(getattr(hf, "multimodal_projector_bias", True)),
        image_size=vc.image_size, patch_size=vc.patch_size,
        dtype=parse_dtype(getattr(hf, "dtype", None) or getattr(tc, "dtype", None)))
