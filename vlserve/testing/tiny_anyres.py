"""Tiny random LLaVA-NeXT checkpoints (anyres), as transformers saves them: the LLaVA-1.5 tiny
model's text and vision configs under a LlavaNextConfig, with grid pinpoints in tile units of the
tower's image size, LlavaNextImageProcessor settings and a LlavaNextProcessor config; OneVision's
and NeXT-Video's likewise. torch and transformers are imported only when a checkpoint is written."""

import os
from dataclasses import replace

from vlserve.testing.checkpoint_tools import IMAGE_TOKEN, clip_image_processor_kwargs
from vlserve.testing.tiny import TinyModelSpec, build_hf_config, train_tokenizer, write_processor_files

VIDEO_TOKEN = "<video>"

# LLaVA-NeXT's default pinpoints (336 px tiles: 1x2, 2x1, 2x2, 1x3, 3x1), in tiles of the tiny tower
GRID_TILES = ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))


def grid_pinpoints(tile: int) -> list[list[int]]:
    return [[rows * tile, cols * tile] for rows, cols in GRID_TILES]


def build_llava_next_config(spec: TinyModelSpec, tokenizer):
    from transformers import LlavaNextConfig

    llava = build_hf_config(spec, tokenizer)
    return LlavaNextConfig(
        vision_config=llava.vision_config, text_config=llava.text_config, image_token_id=llava.image_token_id,
        vision_feature_layer=spec.vision_feature_layer,
        vision_feature_select_strategy=spec.vision_feature_select_strategy,
        image_grid_pinpoints=grid_pinpoints(spec.image_size), tie_word_embeddings=spec.tie_word_embeddings)


def save_llava_next_processor(out_dir: str, spec: TinyModelSpec) -> None:
    image_processor = {"image_processor_type": "LlavaNextImageProcessor", "do_pad": True,
                       "image_grid_pinpoints": grid_pinpoints(spec.image_size),
                       **clip_image_processor_kwargs(spec.image_size)}
    processor = {"processor_class": "LlavaNextProcessor", "patch_size": spec.patch_size,
                 "vision_feature_select_strategy": spec.vision_feature_select_strategy,
                 "num_additional_image_tokens": 1, "image_token": IMAGE_TOKEN}
    write_processor_files(out_dir, image_processor, processor)


def make_tiny_llava_next(out_dir: str, seed: int = 0, spec: TinyModelSpec | None = None) -> str:
    import torch
    from transformers import LlavaNextForConditionalGeneration

    spec = spec or TinyModelSpec()
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = train_tokenizer(spec.vocab_size)
    torch.manual_seed(seed)
    model = LlavaNextForConditionalGeneration(build_llava_next_config(spec, tokenizer)).to(getattr(torch, spec.dtype))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    save_llava_next_processor(out_dir, spec)
    return out_dir


# OneVision's pinpoints are every grid of 1..6 x 1..6 tiles; the tiny one takes 1..4 x 1..4 and
# anyres_max_4, so that wide and large pictures reach the scaling-down past the maximum.
ONEVISION_GRID = tuple((r, c) for r in range(1, 5) for c in range(1, 5))
ONEVISION_MAX = "anyres_max_4"
PUBLISHED_ONEVISION_GRID = tuple((r, c) for r in range(1, 7) for c in range(1, 7))


def build_llava_onevision_config(spec: TinyModelSpec, tokenizer, grid=ONEVISION_GRID, aspect: str = ONEVISION_MAX):
    from transformers import LlavaOnevisionConfig

    base = build_hf_config(spec, tokenizer)
    return LlavaOnevisionConfig(
        vision_config=base.vision_config, text_config=base.text_config, image_token_index=base.image_token_id,
        video_token_index=tokenizer.convert_tokens_to_ids(VIDEO_TOKEN),
        vision_feature_layer=spec.vision_feature_layer,
        vision_feature_select_strategy=spec.vision_feature_select_strategy,
        image_grid_pinpoints=[[r * spec.image_size, c * spec.image_size] for r, c in grid],
        vision_aspect_ratio=aspect, tie_word_embeddings=spec.tie_word_embeddings)


def save_llava_onevision_processor(out_dir: str, spec: TinyModelSpec, tokens_per_view: int,
                                   grid=ONEVISION_GRID, aspect: str = ONEVISION_MAX) -> None:
    size = spec.image_size
    image_processor = {"image_processor_type": "LlavaOnevisionImageProcessor", "do_pad": True,
                       "image_grid_pinpoints": [[r * size, c * size] for r, c in grid],
                       **clip_image_processor_kwargs(size),
                       "size": {"height": size, "width": size}, "do_center_crop": False, "crop_size": None}
    processor = {"processor_class": "LlavaOnevisionProcessor", "num_image_tokens": tokens_per_view,
                 "vision_feature_select_strategy": spec.vision_feature_select_strategy,
                 "vision_aspect_ratio": aspect, "image_token": IMAGE_TOKEN, "video_token": VIDEO_TOKEN}
    write_processor_files(out_dir, image_processor, processor)


def onevision_spec(spec: TinyModelSpec) -> TinyModelSpec:
    """OneVision reads the tower's last layer; with SigLIP it keeps every patch ("full"), with CLIP it
    drops the CLS token ("default"): either way one view is exactly side x side features."""
    strategy = "full" if spec.vision == "siglip" else "default"
    return replace(spec, vision_feature_layer=-1, vision_feature_select_strategy=strategy)


def make_tiny_llava_onevision(out_dir: str, seed: int = 0, spec: TinyModelSpec | None = None,
                              grid=ONEVISION_GRID, aspect: str = ONEVISION_MAX) -> str:
    """grid: the pinpoints in tiles; OneVision's published ones are PUBLISHED_ONEVISION_GRID, anyres_max_9."""
    import torch
    from transformers import LlavaOnevisionForConditionalGeneration

    spec = onevision_spec(spec or TinyModelSpec(text="qwen2", vision="siglip"))
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = train_tokenizer(spec.vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": [VIDEO_TOKEN]})
    torch.manual_seed(seed)
    config = build_llava_onevision_config(spec, tokenizer, grid, aspect)
    model = LlavaOnevisionForConditionalGeneration(config).to(getattr(torch, spec.dtype))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    side = spec.image_size // spec.patch_size
    tokens_per_view = side * side + (spec.vision == "clip")  # LlavaOnevisionProcessor counts the CLS
    save_llava_onevision_processor(out_dir, spec, tokens_per_view, grid, aspect)
    return out_dir


def make_tiny_llava_next_video(out_dir: str, seed: int = 0, spec: TinyModelSpec | None = None) -> str:
    """LLaVA-NeXT-Video: LLaVA-NeXT's images, and frames average-pooled 2x2 before the projector."""
    import torch
    from transformers import LlavaNextVideoConfig, LlavaNextVideoForConditionalGeneration

    spec = spec or TinyModelSpec()
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = train_tokenizer(spec.vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": [VIDEO_TOKEN]})
    torch.manual_seed(seed)
    base = build_hf_config(spec, tokenizer)
    config = LlavaNextVideoConfig(
        vision_config=base.vision_config, text_config=base.text_config, image_token_index=base.image_token_id,
        video_token_index=tokenizer.convert_tokens_to_ids(VIDEO_TOKEN),
        vision_feature_layer=spec.vision_feature_layer,
        vision_feature_select_strategy=spec.vision_feature_select_strategy,
        image_grid_pinpoints=grid_pinpoints(spec.image_size), spatial_pool_mode="average", spatial_pool_stride=2,
        tie_word_embeddings=spec.tie_word_embeddings)
    LlavaNextVideoForConditionalGeneration(config).to(getattr(torch, spec.dtype)).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    save_llava_next_processor(out_dir, spec)
    return out_dir
