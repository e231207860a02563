"""Checkpoint loading: both weight-key layouts, shards, dtypes, and clear errors."""

import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open

from vlserve.core.errors import CheckpointError
from vlserve.model.loader import load_model
from vlserve.testing.tiny import TinyModelSpec, make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=3)


def _weights(path):
    files = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    keys = []
    for f in files:
        with safe_open(os.path.join(path, f), "pt") as sf:
            keys += list(sf.keys())
    return files, keys


def test_llava_hf_layout_sharded_loads_identically(tiny, tmp_path):
    other = make_tiny_model(str(tmp_path / "hf"), seed=3, layout="llava-hf", max_shard_size="100KB")
    files, keys = _weights(other)
    assert len(files) > 1 and os.path.exists(os.path.join(other, "model.safetensors.index.json"))
    assert any(k.startswith("vision_tower.vision_model.") for k in keys)
    assert not any(k.startswith("vision_tower.embeddings") for k in keys)
    _, tiny_keys = _weights(tiny)
    assert any(k.startswith("vision_tower.embeddings.") for k in tiny_keys)  # transformers 5's layout
    a, b = load_model(tiny).model.state_dict(), load_model(other).model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_checkpoints(tmp_path, dtype):
    name = str(dtype).split(".")[-1]
    path = make_tiny_model(str(tmp_path / name), spec=TinyModelSpec(dtype=name))
    loaded = load_model(path)
    assert loaded.config.dtype == dtype
    assert loaded.model.lm_head.weight.dtype == dtype
    assert load_model(path, dtype="float32").model.lm_head.weight.dtype == torch.float32


@pytest.mark.parametrize("missing,message", [
    ("config.json", "missing config.json"),
    ("tokenizer.json", "missing tokenizer"),
    ("preprocessor_config.json", "missing preprocessor_config.json"),
    ("model.safetensors", "missing weights"),
])
def test_missing_file_is_named(tiny, tmp_path, missing, message):
    copy = shutil.copytree(tiny, tmp_path / "ckpt")
    os.remove(copy / missing)
    with pytest.raises(CheckpointError, match=message):
        load_model(str(copy))


def test_missing_shard_is_named(tmp_path):
    path = make_tiny_model(str(tmp_path / "sharded"), max_shard_size="100KB")
    shard = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))[0]
    os.remove(os.path.join(path, shard))
    with pytest.raises(CheckpointError, match=shard):
        load_model(path)


def test_unsupported_architecture_is_named(tiny, tmp_path):
    copy = shutil.copytree(tiny, tmp_path / "ckpt")
    cfg = json.load(open(copy / "config.json"))
    cfg["text_config"]["model_type"] = "gemma"
    json.dump(cfg, open(copy / "config.json", "w"))
    with pytest.raises(CheckpointError, match="unsupported text model 'gemma'"):
        load_model(str(copy))


def test_not_a_directory():
    with pytest.raises(CheckpointError, match="not a directory"):
        load_model("/nonexistent/model")


def test_processor_and_chat_template_as_current_transformers_saves_them(tmp_path):
    """No preprocessor_config.json (the image processor lives in processor_config.json) and the chat
    template only in chat_template.json: the checkpoint loads and serves the same as before."""
    from vlserve import Engine

    src = make_tiny_model(str(tmp_path / "orig"), seed=3)
    dst = str(tmp_path / "moved")
    shutil.copytree(src, dst)
    image_processor = json.load(open(os.path.join(dst, "preprocessor_config.json")))
    os.remove(os.path.join(dst, "preprocessor_config.json"))
    processor = json.load(open(os.path.join(dst, "processor_config.json")))
    json.dump({**processor, "image_processor": image_processor}, open(os.path.join(dst, "processor_config.json"), "w"))
    template = open(os.path.join(dst, "chat_template.jinja")).read()
    os.remove(os.path.join(dst, "chat_template.jinja"))
    tok_cfg = json.load(open(os.path.join(dst, "tokenizer_config.json")))
    tok_cfg.pop("chat_template", None)
    json.dump(tok_cfg, open(os.path.join(dst, "tokenizer_config.json"), "w"))
    json.dump({"chat_template": template}, open(os.path.join(dst, "chat_template.json"), "w"))
    loaded = load_model(dst)
    assert loaded.processor_config == image_processor and loaded.tokenizer.chat_template == template
    params = {"max_new_tokens": 4, "temperature": 0}
    with Engine(src, max_total_tokens=1024) as a, Engine(dst, max_total_tokens=1024) as b:
        picture = _png()
        assert a.generate(prompt="<image>\nHi", image_data=picture, sampling_params=params)["output_ids"] == \
            b.generate(prompt="<image>\nHi", image_data=picture, sampling_params=params)["output_ids"]
    os.remove(os.path.join(dst, "processor_config.json"))
    with pytest.raises(CheckpointError, match="image processor config"):
        load_model(dst)


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 40, 40)).save(buf, "PNG")
    return buf.getvalue()


def _drop_weights(path: str, pattern: str) -> None:
    from safetensors.torch import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    state = load_file(file)
    kept = {k: v for k, v in state.items() if pattern not in k}
    assert len(kept) < len(state), f"no weight matched {pattern!r}"
    save_file(kept, file, metadata={"format": "pt"})


@pytest.mark.parametrize("feature_layer, built", [(-2, 2), (1, 1), ([-3, -2], 2), (-1, 3), ([0, -1], 3)])
def test_the_tower_stops_at_the_deepest_layer_llava_reads(tmp_path, feature_layer, built):
    path = make_tiny_model(str(tmp_path / "ckpt"),
                           spec=TinyModelSpec(vision_layers=3, vision_feature_layer=feature_layer))
    tower = load_model(path).model.vision.vision_tower
    assert len(tower.encoder.layers) == built


def test_weights_of_unbuilt_layers_may_be_absent_but_read_ones_may_not(tmp_path):
    spec = TinyModelSpec(vision_layers=3, vision_feature_layer=-2)  # reads layer 2's output: layer 3 (index 2) unused
    path = make_tiny_model(str(tmp_path / "a"), spec=spec)
    _drop_weights(path, "encoder.layers.2.")
    assert len(load_model(path).model.vision.vision_tower.encoder.layers) == 2
    other = make_tiny_model(str(tmp_path / "b"), spec=spec)
    _drop_weights(other, "encoder.layers.1.")
    with pytest.raises(CheckpointError, match="missing.*encoder.layers.1"):
        load_model(other)


def test_a_feature_layer_outside_the_tower_is_refused(tmp_path):
    path = make_tiny_model(str(tmp_path / "ckpt"), spec=TinyModelSpec(vision_layers=2))
    config = json.load(open(os.path.join(path, "config.json")))
    config["vision_feature_layer"] = -4  # 3 hidden states: embeddings, layer 1, layer 2
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises((CheckpointError, ValueError), match="vision_feature_layer -4"):
        load_model(path)
