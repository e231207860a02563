"""The vision side of LLaVA: a CLIP or SigLIP ViT (transformers' classes) and the two-layer MLP projector."""

import copy

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


def build_vision_tower(vision_hf_config) -> nn.Module:
    """transformers' tower for the config's model_type (model/families.py has checked it is one of these),
    its attention through vision_attention.py."""
    if vision_hf_config.model_type == "siglip_vision_model":
        # LLaVA reads the encoder's hidden states, never SigLIP's attention-pooling head: leave it out
        # (the loader drops its weights, SIGLIP_HEAD_PREFIX).
        vision_hf_config = copy.deepcopy(vision_hf_config)
        vision_hf_config.vision_use_head = False
        tower = SiglipVisionModel(vision_hf_config)
    else:
        tower = CLIPVisionModel(vision_hf_config)
    tower.set_attn_implementation(vision_attention.NAME)  # our CPU kernel; SDPA for everything else
    return tower


SIGLIP_HEAD_PREFIX = "vision.vision_tower.head."


class VisionEncoder(nn.Module):
    """pixel_values [N, 3, H, W] → image embeddings [N, tokens_per_image, text_hidden]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vision_tower = build_vision_tower(cfg.vision_hf_config)
        self.multi_modal_projector = MultiModalProjector(cfg)

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.tower_features(pixel_values))

    @torch.inference_mode()
    def tower_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The tower's selected hidden states, before the projector: [N, tokens_per_image, vision hidden]."""
        dtype = self.multi_modal_projector.linear_1.weight.dtype
        out = self.vision_tower(pixel_values.to(dtype), output_hidden_states=True)
        layers = self.cfg.vision_feature_layer
        layers = (layers,) if isinstance(layers, int) else layers
        feats = [out.hidden_states[i] for i in layers]
        if self.cfg.vision_feature_select_strategy == "default":
            feats = [f[:, 1:] for f in feats]  # drop CLS (SigLIP has none: transformers drops a patch, so do we)
        return torch.cat(feats, dim=-1)

    def encode(self, pixel_values: list[torch.Tensor], image_sizes: list, roles: list[str] | None = None
               ) -> list[torch.Tensor]:
        """One [3, H, W] view per image → per image [tokens_per_image, text_hidden], in one tower batch."""
        return list(self(torch.stack(pixel_values)))
