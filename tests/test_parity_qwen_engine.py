"""Qwen-VL through the whole engine from a text prompt and picture bytes: the chat template's
`<|vision_start|><|image_pad|><|vision_end|>` expanded by the picture's grid (prompt_tokens equals
transformers' expanded length), the checkpoint's Qwen-VL processing, and greedy ids equal to
transformers' on the same pixels — for make-tiny-model's checkpoints of all three, as transformers
saves them and in the published layout (Qwen2-VL / Qwen2.5-VL: flat config, `rope_scaling: mrope`,
`model.layers.*` / `visual.*`; the vocabulary padded past the tokenizer; EOS from generation_config)."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from vlserve.engine.engine import Engine
from vlserve.testing.tiny_qwen_vl import make_tiny_qwen_vl

STEPS = 8


def _png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("arch,layout", [("qwen2-vl", "published"), ("qwen2.5-vl", "transformers"),
                                         ("qwen3-vl", "published")])
def test_prompt_with_pictures_matches_transformers(tmp_path, arch, layout):
    from transformers import AutoModelForImageTextToText

    path = make_tiny_qwen_vl(str(tmp_path), arch, seed=2, layout=layout)
    pictures = [_png(97, 61, 1), _png(40, 150, 2)]  # odd sizes; the second below min_pixels on one side
    with Engine(path, max_total_tokens=1024) as engine:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the image?"},
                                                  {"type": "image"}, {"type": "text", "text": "And this one?"}]}]
        prompt = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out = engine.generate(prompt=prompt, image_data=pictures,
                              sampling_params={"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True})
        cfg, processing = engine.loaded.config, engine.loaded.image_processing
        assert cfg.text.eos_token_ids[:1] == (engine.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
        assert len(cfg.text.eos_token_ids) == 2  # <|endoftext|> from generation_config.json
        items = [processing.process(Image.open(io.BytesIO(p)).convert("RGB")) for p in pictures]
        ids = engine.tokenizer(prompt)["input_ids"]
    queue, expanded = list(items), []
    for t in ids:  # as transformers' processor expands each <|image_pad|>
        expanded += [t] * (queue.pop(0).num_tokens if t == cfg.image_token_id else 1)
    assert out["meta_info"]["prompt_tokens"] == len(expanded)
    hf = AutoModelForImageTextToText.from_pretrained(path).eval()
    inputs = {"input_ids": torch.tensor([expanded]),
              "mm_token_type_ids": torch.tensor([[int(t == cfg.image_token_id) for t in expanded]]),
              "pixel_values": torch.cat([torch.from_numpy(i.rows) for i in items]),
              "image_grid_thw": torch.tensor([i.grid_thw for i in items])}
    ref = hf.generate(**inputs, max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS)
    assert out["output_ids"] == ref[0, len(expanded):].tolist()


def test_router_key_is_the_engines_radix_key(tmp_path):
    """The router keys a Qwen-VL request as its engine does: the picture's grid of pseudo tokens."""
    import base64
    import json

    from vlserve.router.keys import RouteKeys
    from vlserve.router.model_files import ModelFiles

    path = make_tiny_qwen_vl(str(tmp_path), "qwen2-vl", seed=1)
    uri = "data:image/png;base64," + base64.b64encode(_png(97, 61, 3)).decode()
    body = {"text": "<|vision_start|><|image_pad|><|vision_end|>Describe it.", "image_data": uri}
    got = RouteKeys(ModelFiles.read(path)).key("/generate", json.dumps(body).encode())
    with Engine(path, max_total_tokens=1024) as engine:
        expected = engine.tokenize(prompt=body["text"], image_data=[uri])
        # 97x61 -> smart_resize 84x56 -> a 4x6 patch grid -> 6 merged tokens
        assert sum(t >= engine.loaded.config.text.vocab_size for t in expected) == 6
    assert got == expected


@pytest.mark.slow
def test_triton_path_matches_the_cpu_kernel(tmp_path):
    """--attention-backend triton (Triton's interpreter without a GPU) gives the torch backend's ids
    and logits within 1e-4 for a picture prompt, prefill and decode."""
    path = make_tiny_qwen_vl(str(tmp_path), "qwen2.5-vl", seed=6)
    prompt = "<|vision_start|><|image_pad|><|vision_end|>What is it?"
    results = []
    for backend in ("torch", "triton"):
        with Engine(path, max_total_tokens=512, attention_backend=backend) as engine:
            steps = []
            forward = engine.runner.forward
            engine.runner.forward = lambda batch: steps.append(forward(batch).clone()) or steps[-1]
            out = engine.generate(prompt=prompt, image_data=[_png(60, 90, 4)],
                                  sampling_params={"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})
            results.append((out["output_ids"], steps))
    (ids_cpu, steps_cpu), (ids_triton, steps_triton) = results
    assert ids_triton == ids_cpu and len(steps_triton) == len(steps_cpu)
    for a, b in zip(steps_cpu, steps_triton):
        assert torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()


@pytest.mark.parametrize("arch", ["qwen2-vl", "qwen2.5-vl"])
def test_prompt_with_a_video_and_a_picture_matches_transformers(tmp_path, arch):
    """video_data: frames sampled as for every family, paired and patched by the Qwen-VL video
    processing (Qwen2.5-VL: seconds per pair from the sampled fps), the pad expanded per pair; greedy
    ids equal transformers' on the same pixels, and prompt_tokens its expanded length."""
    from transformers import AutoModelForImageTextToText

    from helpers.server_helpers import mp4
    from vlserve.preprocess import read_video
    from vlserve.preprocess.qwen_vl_video import QwenVLVideoProcessing, process_sampled_video

    path = make_tiny_qwen_vl(str(tmp_path), arch, seed=3)
    clip, picture = mp4(num_frames=8, size=64), _png(50, 80, 5)
    prompt = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>and"
              "<|vision_start|><|video_pad|><|vision_end|>What happens?<|im_end|>\n<|im_start|>assistant\n")
    with Engine(path, max_total_tokens=2048) as engine:
        out = engine.generate(prompt=prompt, image_data=[picture], video_data=[clip], video_num_frames=5,
                              sampling_params={"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True})
        cfg, processing = engine.loaded.config, engine.loaded.image_processing
        ids = engine.tokenizer(prompt)["input_ids"]
    image = processing.process(Image.open(io.BytesIO(picture)).convert("RGB"))
    model_type = cfg.vision_hf_config.model_type.removesuffix("_vision")
    video = process_sampled_video(QwenVLVideoProcessing(model_type, processing), read_video(clip, num_frames=5))
    assert len(video.patches) == 3  # 5 frames: the last repeated to make the third pair
    expanded, types = [], []
    for t in ids:
        n, kind = {cfg.image_token_id: (image.num_tokens, 1), cfg.video_token_id: (video.num_tokens, 2)}.get(t, (1, 0))
        expanded += [t] * n
        types += [kind] * n
    assert out["meta_info"]["prompt_tokens"] == len(expanded)
    inputs = {"input_ids": torch.tensor([expanded]), "mm_token_type_ids": torch.tensor([types]),
              "pixel_values": torch.from_numpy(image.rows), "image_grid_thw": torch.tensor([image.grid_thw]),
              "pixel_values_videos": torch.cat([torch.from_numpy(p.rows) for p in video.patches]),
              "video_grid_thw": torch.tensor([video.grid_thw])}
    if video.second_per_grid_t is not None:
        inputs["second_per_grid_ts"] = torch.tensor([video.second_per_grid_t])
    hf = AutoModelForImageTextToText.from_pretrained(path).eval()
    ref = hf.generate(**inputs, max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS)
    assert out["output_ids"] == ref[0, len(expanded):].tolist()
