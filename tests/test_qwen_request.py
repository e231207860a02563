"""A Qwen-VL request from its prompt text and media bytes (engine/qwen_prompt.py), through
Engine.generate: the chat template's pads expanded to transformers' length, greedy ids equal to
transformers' generate on the same pixels, a follow-up about the same picture served from the
cache, Qwen3-VL's timestamped frame pairs, and a pad count that does not match the media refused."""

import io

import pytest
import torch
from PIL import Image

from helpers.qwen_helpers import hf_inputs
from vlserve.bench.workload_defs import scene_png, video_mp4
from vlserve.core.errors import InvalidRequest
from vlserve.engine.engine import Engine
from vlserve.preprocess import read_video
from vlserve.preprocess.qwen_vl import QwenVLProcessing
from vlserve.preprocess.qwen_vl_media import QwenVLMediaProcessing
from vlserve.preprocess.qwen_vl_video import process_sampled_video
from vlserve.testing.tiny_qwen_vl import make_tiny_qwen_vl

PICTURE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
STEPS = 6


def chat(content: str) -> str:
    return f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module", params=["qwen2.5-vl", "qwen3-vl"])
def checkpoint(request, tmp_path_factory):
    return make_tiny_qwen_vl(str(tmp_path_factory.mktemp(request.param)), request.param, seed=5)


@pytest.fixture(scope="module")
def engine(checkpoint):
    with Engine(checkpoint, num_threads=1, video_frames=8) as engine:
        yield engine


def _generate(engine: Engine, prompt: str, **media) -> dict:
    return engine.generate(prompt=prompt, sampling_params={"max_new_tokens": STEPS, "temperature": 0,
                                                           "ignore_eos": True}, **media)


def test_picture_from_bytes_matches_transformers(checkpoint, engine):
    from transformers import AutoModelForImageTextToText

    png = scene_png(3, size=100)  # 100 px: 112 (an 8x8 grid, 16 tokens), 96 for Qwen3-VL (6x6, 9)
    prompt = chat(f"{PICTURE}What is in the picture?")
    out = _generate(engine, prompt, image_data=png)
    again = _generate(engine, chat(f"{PICTURE}What colour?"), image_data=png)
    cfg, tokenizer, media = engine.loaded.config, engine.tokenizer, engine.loaded.image_processing
    assert isinstance(media, QwenVLMediaProcessing) and isinstance(media.image, QwenVLProcessing)
    processing = media.image
    picture = processing.process(Image.open(io.BytesIO(png)).convert("RGB")).pixel_values
    ids = tokenizer(prompt)["input_ids"]
    inputs = hf_inputs(ids, [picture], cfg)
    n = picture.shape[1] * picture.shape[2] // 4
    assert n == (16 if cfg.vision_hf_config.patch_size == 14 else 9)
    assert out["meta_info"]["prompt_tokens"] == inputs["input_ids"].shape[1] == len(ids) - 1 + n
    hf = AutoModelForImageTextToText.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        ref = hf.generate(**inputs, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
    assert out["output_ids"] == ref[0, inputs["input_ids"].shape[1]:].tolist()
    # the follow-up shares the turn's opening and the picture: at least those tokens come from the cache
    assert again["meta_info"]["cached_tokens"] >= ids.index(cfg.image_token_id) + n


def test_video_from_bytes(engine):
    clip = video_mp4(4, frames=8, size=64)  # 64 px frames: 56x56, a 4x4 grid, 4 pairs of 4 tokens
    out = _generate(engine, chat(f"{VIDEO}What happens?"), video_data=clip)
    video = process_sampled_video(engine.loaded.image_processing.video, read_video(clip, num_frames=8))
    assert len(video.patches) == 4 and len(read_video(clip, num_frames=8).frames) == 8
    if engine.loaded.config.text.mrope_interleaved:  # Qwen3-VL: each pair after its `<t seconds>`, its own pad
        assert video.second_per_grid_t is None and len(video.timestamps) == 4
        text = chat("".join(f"<{t:.1f} seconds>{VIDEO}" for t in video.timestamps) + "What happens?")
        assert out["meta_info"]["prompt_tokens"] == len(engine.tokenizer(text)["input_ids"]) - 4 + 16
    else:  # one pad for the 4 pairs; 8 frames of a 4 fps clip: half a second a pair
        assert video.second_per_grid_t == pytest.approx(0.5) and video.timestamps is None
        text = chat(f"{VIDEO}What happens?")
        assert out["meta_info"]["prompt_tokens"] == len(engine.tokenizer(text)["input_ids"]) - 1 + 16
    assert len(out["output_ids"]) == STEPS


def test_pads_must_match_the_media(engine):
    with pytest.raises(InvalidRequest, match="image and 0 video pad tokens"):
        _generate(engine, chat(f"{PICTURE}{PICTURE}Two?"), image_data=scene_png(1))
    # a picture without a pad goes first, as an `<image>`-less LLaVA prompt places it
    unplaced = _generate(engine, chat("No pad here"), image_data=scene_png(1))
    placed = _generate(engine, PICTURE + chat("No pad here"), image_data=scene_png(1))
    assert unplaced["output_ids"] == placed["output_ids"]
    assert unplaced["meta_info"]["prompt_tokens"] == placed["meta_info"]["prompt_tokens"]
