"""What vlserve needs to know about a LLaVA checkpoint, read through transformers' own config classes."""

from dataclasses import dataclass
from typing import Any, Callable

import torch

from vlserve.core.errors import CheckpointError
from vlserve.model.anyres_layout import AnyresLayout
from vlserve.model.mrope import MRopeLayout

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
    qkv_bias: bool
    o_bias: bool
    sliding_window: int | None  # attention sees only this many latest tokens (Mistral); None: all
    eos_token_ids: tuple[int, ...]
    hf_config: Any  # transformers' text config, for RoPE initialisation
    mrope_section: tuple[int, ...] | None = None  # M-RoPE: frequencies per (temporal, height, width) axis
    mrope_interleaved: bool = False  # Qwen3-VL: the axes' frequencies interleaved, not in blocks
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head of q and k before the rotary


@dataclass(frozen=True)
class ModelConfig:
    text: TextConfig
    vision_hf_config: Any  # transformers' CLIPVisionConfig
    image_token_id: int
    vision_feature_layer: int | tuple[int, ...]
    vision_feature_select_strategy: str  # "default" drops CLS, "full" keeps it
    vision_has_cls: bool  # CLIP: a CLS token before the patches; SigLIP: patches only
    projector_hidden_act: str
    projector_bias: bool
    image_size: int
    patch_size: int
    dtype: torch.dtype

    anyres: AnyresLayout | None = None  # LLaVA-NeXT: tiles, so the token count depends on the image
    mrope: MRopeLayout | None = None  # Qwen-VL: native-resolution grids and M-RoPE positions
    video_token_id: int | None = None  # Qwen-VL: the pad standing for a video (its frame pairs)

    def image_tokens(self, image) -> int:
        """Placeholder tokens for a preprocess.ProcessedImage: by its views, original size and role."""
        if self.mrope is not None:  # pixels [t, h, w, patch]: the grid in the shape
            return self.mrope.tokens(image.pixel_values.shape[:3])
        layout = self.anyres
        if layout is None:
            return self.tokens_per_image
        if image.role != "image" and layout.frame_pool is not None:
            return layout.pooled_side ** 2
        if image.role != "image" and layout.pooled_video:
            return layout.pooled_side ** 2 + (image.role == "last_frame")
        if image.pixel_values.ndim == 3:  # one view: a video frame, or (OneVision) one of several images
            return self.tokens_per_image + layout.single_view_newline
        return self.tiled_image_tokens(image.image_size)

    def tiled_image_tokens(self, image_size: tuple[int, int]) -> int:
        """An anyres image of this original (height, width): the base view, then the tiles' rows."""
        return self.tokens_per_image + self.anyres.tile_tokens(image_size)

    @property
    def fixed_image_tokens(self) -> int | None:
        """Tokens of every image when that does not depend on the image (LLaVA-1.5), else None."""
        return self.tokens_per_image if self.anyres is None and self.mrope is None else None

    @property
    def tokens_per_image(self) -> int:
        """Tokens of one view (a whole image in LLaVA-1.5, a video frame, one anyres tile)."""
        # transformers' get_image_features drops the first position under "default" whether or not
        # it is a CLS token (with SigLIP it drops a patch), so count exactly that.
        n = (self.image_size // self.patch_size) ** 2 + self.vision_has_cls
        return n - 1 if self.vision_feature_select_strategy == "default" else n

    @property
    def context_limit(self) -> tuple[int, str]:
        """The longest context served, and why when it is shorter than max_position_embeddings."""
        text = self.text
        if text.sliding_window is not None and text.sliding_window < text.max_position_embeddings:
            return text.sliding_window, (
                f"capped at the text model's sliding window of {text.sliding_window} tokens: vlserve "
                f"attends over the whole context, which equals sliding-window attention only up to the window")
        return text.max_position_embeddings, ""


# text model_type → its attention's (q/k/v bias, o_proj bias), as transformers builds them
ATTENTION_BIASES: dict[str, Callable[[Any], tuple[bool, bool]]] = {
    "llama": lambda tc: (bool(getattr(tc, "attention_bias", False)),) * 2,
    "mistral": lambda tc: (False, False),
    "qwen2": lambda tc: (True, False),
}
# vision model_type → whether its hidden states start with a CLS token
VISION_HAS_CLS = {"clip_vision_model": True, "siglip_vision_model": False}

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
    """Builds a ModelConfig from a transformers LlavaConfig whose architecture, text and vision models
    model/families.py has accepted; rejects the settings the native model lacks."""
    tc, vc = hf.text_config, hf.vision_config
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
    qkv_bias, o_bias = ATTENTION_BIASES[tc.model_type](tc)
    text = TextConfig(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_layers=tc.num_hidden_layers, num_heads=tc.num_attention_heads,
        num_kv_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
        head_dim=head_dim, rms_norm_eps=tc.rms_norm_eps,
        max_position_embeddings=tc.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)
                                 or getattr(tc, "tie_word_embeddings", False)),
        qkv_bias=qkv_bias, o_bias=o_bias, sliding_window=_sliding_window(tc),
        eos_token_ids=eos_ids, hf_config=tc)
    return ModelConfig(
        text=text, vision_hf_config=vc, image_token_id=hf.image_token_id,
        vision_feature_layer=layer if isinstance(layer, int) else tuple(layer),
        vision_feature_select_strategy=strategy, vision_has_cls=VISION_HAS_CLS[vc.model_type],
        projector_hidden_act=getattr(hf, "projector_hidden_act", "gelu"),
        projector_bias=bool(getattr(hf, "multimodal_projector_bias", True)),
        image_size=vc.image_size, patch_size=vc.patch_size,
        dtype=parse_dtype(getattr(hf, "dtype", None) or getattr(tc, "dtype", None)))


def _sliding_window(tc) -> int | None:
    """Mistral: every layer when sliding_window is set. Qwen2: only the layers layer_types marks
    "sliding_attention" (none unless use_sliding_window)."""
    window = getattr(tc, "sliding_window", None)
    layer_types = getattr(tc, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return int(window)
