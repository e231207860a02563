"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL for serving: the Qwen tower's merged patches scattered into
the media rows, then the paged decoder (llama.py) rotated by M-RoPE positions (Req.mrope).

Qwen2-VL's and Qwen2.5-VL's decoders are Qwen2's (q/k/v biases); Qwen3-VL's is Qwen3's (a norm
over each head of q and k, no biases). The published configs are read through transformers:
Qwen2-VL's flat layout (text fields at the top, `rope_scaling: {type: mrope}`) and the nested one
transformers writes both come out as text_config / vision_config.
"""

from typing import Any

import torch

from vlserve.core.errors import CheckpointError
from vlserve.core.forward_batch import ForwardBatch
from vlserve.memory.kv_pool import KVPool
from vlserve.model.attention import AttentionBackend
from vlserve.model.config import ModelConfig, TextConfig, parse_dtype, _sliding_window
from vlserve.model.llava import LlavaForServing
from vlserve.model.llama import logits_hidden
from vlserve.model.mrope import MRopeLayout
from vlserve.model.qwen_vision import Qwen25VisionTower, Qwen2VisionTower, Qwen3VisionTower

# text model_type → (q/k/v bias, q/k norm, M-RoPE frequencies interleaved, default mrope_section)
_TEXT_MODELS = {
    "qwen2_vl_text": (True, False, False, (16, 24, 24)),
    "qwen2_5_vl_text": (True, False, False, (16, 24, 24)),
    "qwen3_vl_text": (False, True, True, (24, 20, 20)),
}


class Qwen2VLForServing(LlavaForServing):
    vision_encoder = Qwen2VisionTower


class Qwen25VLForServing(LlavaForServing):
    vision_encoder = Qwen25VisionTower


class Qwen3VLForServing(LlavaForServing):
    """Each media row's embedding carries DeepStack's levels after the LM input (Qwen3VisionTower)."""
    vision_encoder = Qwen3VisionTower

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend) -> torch.Tensor:
        hidden = self.language_model.embed_tokens(batch.input_ids)
        deepstack = None
        if batch.image_mask is not None:
            size = hidden.shape[1]
            embeds = batch.image_embeds.to(hidden.dtype)
            hidden[batch.image_mask] = embeds[:, :size]
            deepstack = embeds[:, size:].reshape(embeds.shape[0], -1, size).transpose(0, 1)
        hidden = self.language_model(hidden, batch, kv, attn, deepstack)
        return self.lm_head(logits_hidden(hidden, batch)).float()


def qwen_vl_config_from_hf(hf) -> ModelConfig:
    tc, vc = hf.text_config, hf.vision_config
    qkv_bias, qk_norm, interleaved, default_section = _TEXT_MODELS[tc.model_type]
    rope = dict(getattr(tc, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise CheckpointError(f"unsupported rope_type {rope.get('rope_type')!r} for {hf.model_type}; served: default "
                              f"(M-RoPE)")
    section = tuple(rope.get("mrope_section") or default_section)
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    attention_bias = bool(getattr(tc, "attention_bias", False))  # Qwen3: on q/k/v and o alike
    if 2 * sum(section) != head_dim:
        raise CheckpointError(f"mrope_section {list(section)} does not cover head_dim {head_dim}")
    text = TextConfig(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_layers=tc.num_hidden_layers, num_heads=tc.num_attention_heads,
        num_kv_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads, head_dim=head_dim,
        rms_norm_eps=tc.rms_norm_eps, max_position_embeddings=tc.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        qkv_bias=qkv_bias or attention_bias, o_bias=attention_bias,
        sliding_window=_sliding_window(tc), eos_token_ids=_eos_ids(hf), hf_config=tc,
        mrope_section=section, mrope_interleaved=interleaved, qk_norm=qk_norm)
    tokens_per_second = getattr(vc, "tokens_per_second", None) if hf.model_type == "qwen2_5_vl" else None
    return ModelConfig(
        text=text, vision_hf_config=vc, image_token_id=hf.image_token_id,
        vision_feature_layer=-1, vision_feature_select_strategy="full", vision_has_cls=False,
        projector_hidden_act="gelu", projector_bias=True, image_size=vc.patch_size, patch_size=vc.patch_size,
        dtype=parse_dtype(getattr(hf, "dtype", None) or getattr(tc, "dtype", None)),
        mrope=MRopeLayout(vc.spatial_merge_size, tokens_per_second), video_token_id=hf.video_token_id)


def _eos_ids(hf: Any) -> tuple[int, ...]:
    eos = getattr(hf.text_config, "eos_token_id", None)
    eos = eos if eos is not None else getattr(hf, "eos_token_id", None)
    return tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
