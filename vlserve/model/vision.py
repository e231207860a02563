"""The vision side of LLaVA: a CLIP or SigLIP ViT (transformers' classes) and the two-layer MLP projector.

LLaVA reads the tower's hidden states at `vision_feature_layer` (LLaVA-1.5: -2, the penultimate
layer), so the layers after the deepest one read are never built: their outputs would be thrown away
(a 24-layer CLIP-L read at -2 computes one layer in 24 for nothing; vLLM drops them the same way).
The loader skips their weights (unused_checkpoint_key).
"""

import copy
import re

import torch
from torch import nn
from transformers import CLIPVisionModel, SiglipVisionModel
from transformers.activations import ACT2FN

from vlserve.model import vision_attention
from vlserve.model.config import ModelConfig


class MultiModalProjector(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        layers = 1 if isinstance(cfg.vision_feature_layer, int) else len(cfg.vision_feature_layer)
        vision_hidden, text_hidden = cfg.vision_hf_config.hidden_size, cfg.text.hidden_size
        self.linear_1 = nn.Linear(vision_hidden * layers, text_hidden, bias=cfg.projector_bias)
        self.act = ACT2FN[cfg.projector_hidden_act]
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=cfg.projector_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


def feature_indices(cfg: ModelConfig) -> tuple[int, ...]:
    """vision_feature_layer as indices from the front of the tower's hidden states (0: the embeddings,
    i: the output of encoder layer i)."""
    layers = cfg.vision_feature_layer
    layers = (layers,) if isinstance(layers, int) else tuple(layers)
    total = cfg.vision_hf_config.num_hidden_layers + 1
    if not all(-total <= i < total for i in layers):
        raise ValueError(f"vision_feature_layer {cfg.vision_feature_layer} is outside the tower's "
                         f"{total} hidden states")
    return tuple(i % total for i in layers)


def kept_layers(cfg: ModelConfig) -> int:
    """Encoder layers up to the deepest one LLaVA reads (at least one)."""
    return max(1, *feature_indices(cfg))


def build_vision_tower(vision_hf_config, num_layers: int | None = None) -> nn.Module:
    """transformers' tower for the config's model_type (model/families.py has checked it is one of these),
    with its first `num_layers` encoder layers (all by default), its attention through vision_attention.py."""
    vision_hf_config = copy.deepcopy(vision_hf_config)
    vision_hf_config.num_hidden_layers = num_layers or vision_hf_config.num_hidden_layers
    if vision_hf_config.model_type == "siglip_vision_model":
        # LLaVA reads the encoder's hidden states, never SigLIP's attention-pooling head: leave it out
        # (the loader drops its weights, unused_checkpoint_key).
        vision_hf_config.vision_use_head = False
        tower = SiglipVisionModel(vision_hf_config)
    else:
        tower = CLIPVisionModel(vision_hf_config)
    tower.set_attn_implementation(vision_attention.NAME)  # our CPU kernel; SDPA for everything else
    return tower


SIGLIP_HEAD_PREFIX = "vision.vision_tower.head."
_TOWER_LAYER = re.compile(r"^vision\.vision_tower\.encoder\.layers\.(\d+)\.")  # served names (loader.py renames)


def unused_checkpoint_key(key: str, cfg: ModelConfig) -> bool:
    """A checkpoint weight (in the served names) of a part that is not built: SigLIP's pooling head, or
    an encoder layer past kept_layers(cfg)."""
    if key.startswith(SIGLIP_HEAD_PREFIX):
        return True
    layer = _TOWER_LAYER.match(key)
    return layer is not None and int(layer.group(1)) >= kept_layers(cfg)


class VisionEncoder(nn.Module):
    """pixel_values [N, 3, H, W] → image embeddings [N, tokens_per_image, text_hidden]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.feature_indices = feature_indices(cfg)
        self.vision_tower = build_vision_tower(cfg.vision_hf_config, kept_layers(cfg))
        self.multi_modal_projector = MultiModalProjector(cfg)

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.tower_features(pixel_values))

    @torch.inference_mode()
    def tower_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The tower's selected hidden states, before the projector: [N, tokens_per_image, vision hidden]."""
        dtype = next(self.vision_tower.parameters()).dtype  # a packed linear's .weight would be a copy
        out = self.vision_tower(pixel_values.to(dtype), output_hidden_states=True)
        feats = [out.hidden_states[i] for i in self.feature_indices]
        if self.cfg.vision_feature_select_strategy == "default":
            feats = [f[:, 1:] for f in feats]  # drop CLS (SigLIP has none: transformers drops a patch, so do we)
        return torch.cat(feats, dim=-1)

    def encode(self, pixel_values: list[torch.Tensor], image_sizes: list, roles: list[str] | None = None
               ) -> list[torch.Tensor]:
        """One [3, H, W] view per image → per image [tokens_per_image, text_hidden], in one tower batch."""
        return list(self(torch.stack(pixel_values)))
