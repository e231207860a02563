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
