"""LLaVA for serving: image embeddings scattered into placeholder rows, then the paged decoder."""

import torch
from torch import nn

from vlserve.memory.kv_pool import KVPool
from vlserve.model.attention import AttentionBackend
from vlserve.model.config import ModelConfig
from vlserve.core.forward_batch import ForwardBatch
from vlserve.model.llama import LlamaDecoder
from vlserve.model.vision import VisionEncoder


class LlavaForServing(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vision = VisionEncoder(cfg)
        self.language_model = LlamaDecoder(cfg.text)
        self.lm_head = nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False)
        if cfg.text.tie_word_embeddings:
            self.lm_head.weight = self.language_model.embed_tokens.weight

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vision(pixel_values)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend) -> torch.Tensor:
        """Returns float32 logits [len(batch.logits_rows), vocab]."""
        hidden = self.language_model.embed_tokens(batch.input_ids)
        if batch.image_mask is not None:
            hidden[batch.image_mask] = batch.image_embeds.to(hidden.dtype)
        hidden = self.language_model(hidden, batch, kv, attn)
        return self.lm_head(hidden[batch.logits_rows]).float()
