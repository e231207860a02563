"""LLaVA for serving: image embeddings scattered into placeholder rows, then the paged decoder."""

from dataclasses import replace

import torch
from torch import nn

from vlserve.core.errors import CheckpointError
from vlserve.memory.kv_pool import KVPool
from vlserve.model.attention import AttentionBackend
from vlserve.model.anyres_layout import AnyresLayout
from vlserve.model.config import ModelConfig, model_config_from_hf
from vlserve.core.forward_batch import ForwardBatch
from vlserve.model.llama import LlamaDecoder, logits_hidden
from vlserve.model.llava_next import AnyresVisionEncoder
from vlserve.model.vision import VisionEncoder


class LlavaForServing(nn.Module):
    vision_encoder = VisionEncoder  # what turns an image's views into its placeholder rows' embeddings

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vision = self.vision_encoder(cfg)
        self.language_model = LlamaDecoder(cfg.text)
        self.lm_head = nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False)
        if cfg.text.tie_word_embeddings:
            self.lm_head.weight = self.language_model.embed_tokens.weight

    @torch.inference_mode()  # no autograd graph: a tower run with it kept every layer's activations
    def encode_images(self, pixel_values: list[torch.Tensor], image_sizes: list, roles: list[str] | None = None
                      ) -> list[torch.Tensor]:
        """Per image its pixels ([3, H, W], or [views, 3, H, W]), original (height, width) and role
        (preprocess.ProcessedImage) → per image the embeddings of its placeholder rows,
        [cfg.image_tokens(image), hidden]."""
        return self.vision.encode(pixel_values, image_sizes, roles)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend) -> torch.Tensor:
        """Returns float32 logits [len(batch.logits_rows), vocab]."""
        hidden = self.language_model.embed_tokens(batch.input_ids)
        if batch.image_mask is not None:
            hidden[batch.image_mask] = batch.image_embeds.to(hidden.dtype)
        hidden = self.language_model(hidden, batch, kv, attn)
        return self.lm_head(logits_hidden(hidden, batch)).float()


def llava_next_config_from_hf(hf) -> ModelConfig:
    """LLaVA-1.5's config plus the anyres layout: the grid pinpoints and the tiles' feature grid."""
    cfg = model_config_from_hf(hf)
    side = cfg.image_size // cfg.patch_size
    pinpoints = tuple(tuple(int(v) for v in p) for p in hf.image_grid_pinpoints)
    return replace(cfg, anyres=AnyresLayout(pinpoints, cfg.image_size, side))


def llava_onevision_config_from_hf(hf) -> ModelConfig:
    """LLaVA-NeXT's plus anyres_max scaling, a newline after an untiled image, pooled video frames."""
    cfg = llava_next_config_from_hf(hf)
    aspect = getattr(hf, "vision_aspect_ratio", "anyres_max_9")
    if not aspect.startswith("anyres_max_"):
        raise CheckpointError(f"unsupported vision_aspect_ratio {aspect!r}; served: anyres_max_N")
    max_tiles = int(aspect[len("anyres_max_"):])
    return replace(cfg, anyres=replace(cfg.anyres, max_tiles=max_tiles, single_view_newline=True, pooled_video=True))


def llava_next_video_config_from_hf(hf) -> ModelConfig:
    """LLaVA-NeXT's plus each video frame's tower features pooled before the projector."""
    cfg = llava_next_config_from_hf(hf)
    mode, stride = getattr(hf, "spatial_pool_mode", "average"), int(getattr(hf, "spatial_pool_stride", 2))
    if mode not in ("average", "max"):
        raise CheckpointError(f"unsupported spatial_pool_mode {mode!r}; served: average, max")
    return replace(cfg, anyres=replace(cfg.anyres, frame_pool=(mode, stride)))


class LlavaNextForServing(LlavaForServing):
    """LLaVA-NeXT and OneVision: the same decoder; images as a base view plus anyres tiles
    (llava_next.py), what differs between the two being in the config's AnyresLayout."""
    vision_encoder = AnyresVisionEncoder
