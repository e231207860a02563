"""Rewrites a Qwen-VL checkpoint saved by transformers 5 into the layout the Hub's checkpoints have.

Qwen2-VL and Qwen2.5-VL publish a flat config.json (the decoder's keys at the top level beside
`vision_config`, `rope_scaling: {"type": "mrope", "mrope_section": [...]}` and `rope_theta`) and
weights named `model.layers.*`, `model.embed_tokens.*`, `visual.*`, `lm_head.*`. Qwen3-VL publishes
a nested text_config with `rope_scaling` (`mrope_interleaved`) and transformers 5's weight names.
"""

import json
import os

from vlserve.testing.tiny import rename_weights

_TEXT_DROPPED = ("model_type", "layer_types", "rope_parameters", "dtype")


def rewrite_to_published_layout(ckpt_dir: str, flat: bool) -> None:
    path = os.path.join(ckpt_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config = flat_config(config) if flat else nested_config(config)
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    if flat:
        rename_weights(ckpt_dir, flat_weight_name)


def _rope_scaling(rope_parameters: dict, flat: bool) -> tuple[dict, float]:
    """(rope_scaling, rope_theta) as published: Qwen2(.5)-VL `{"type": "mrope", ...}`, Qwen3-VL
    `{"rope_type": "default", ...}`."""
    scaling = {k: v for k, v in rope_parameters.items() if k not in ("rope_theta", "rope_type", "type")}
    head = {"type": "mrope"} if flat else {"rope_type": "default"}
    return {**head, **scaling}, rope_parameters["rope_theta"]


def flat_config(config: dict) -> dict:
    text = config.pop("text_config")
    rope_scaling, rope_theta = _rope_scaling(text["rope_parameters"], flat=True)
    flat = {k: v for k, v in text.items() if k not in _TEXT_DROPPED}
    vision = config.pop("vision_config")
    vision.pop("rope_parameters", None)
    return {**config, **flat, "rope_scaling": rope_scaling, "rope_theta": rope_theta, "vision_config": vision,
            "torch_dtype": config.get("dtype", "float32")}


def nested_config(config: dict) -> dict:
    text = dict(config["text_config"])
    text["rope_scaling"], text["rope_theta"] = _rope_scaling(text.pop("rope_parameters"), flat=False)
    config["vision_config"].pop("rope_parameters", None)
    return {**config, "text_config": text}


def flat_weight_name(name: str) -> str:
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    if name.startswith("model.visual."):
        return name[len("model."):]
    return name
