"""Tiny random LLaVA-NeXT checkpoints (anyres), as transformers saves them: the LLaVA-1.5 tiny
model's text and vision configs under a LlavaNextConfig, with grid pinpoints in tile units of the
tower's image size, LlavaNextImageProcessor settings and a LlavaNextProcessor config."""

import os

import torch

from vlserve.model.checkpoint_tools import IMAGE_TOKEN, clip_image_processor_kwargs
from vlserve.model.tiny import TinyModelSpec, build_hf_config, train_tokenizer, write_processor_files

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
