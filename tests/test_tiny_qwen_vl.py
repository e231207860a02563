"""`vlserve make-tiny-model --arch qwen2-vl|qwen2.5-vl|qwen3-vl` writes checkpoints that transformers'
AutoProcessor and AutoModelForImageTextToText load and run (in a process with the reference
torchvision, tests/helpers/reference_torchvision.py), in transformers' layout and the Hub's."""

import json
import subprocess
import sys

import pytest
from safetensors import safe_open

from helpers.reference_torchvision import run_reference
from vlserve.testing.tiny_qwen_vl import QWEN_SPECIAL_TOKENS, make_tiny_qwen_vl

# the tests of the written checkpoints share their writing and one reference run: about 30 s on two cores
shares_checkpoints = pytest.mark.slow
ARCHES = {  # --arch -> (architecture, model_type, processor, patch_size)
    "qwen2-vl": ("Qwen2VLForConditionalGeneration", "qwen2_vl", "Qwen2VLProcessor", 14),
    "qwen2.5-vl": ("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", "Qwen2_5_VLProcessor", 14),
    "qwen3-vl": ("Qwen3VLForConditionalGeneration", "qwen3_vl", "Qwen3VLProcessor", 16),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{(arch, layout): (dir, what transformers saw)}: the CLI writes transformers' layout, the
    function the published one; one reference process loads and runs all six."""
    dirs = {(arch, "transformers"): str(tmp_path_factory.mktemp(arch)) for arch in ARCHES}
    writers = [subprocess.Popen([sys.executable, "-m", "vlserve", "make-tiny-model", dirs[arch, "transformers"],
                                 "--arch", arch], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for arch in ARCHES]  # the three at once
    for arch in ARCHES:
        dirs[arch, "published"] = make_tiny_qwen_vl(str(tmp_path_factory.mktemp(arch + "-hub")), arch,
                                                    layout="published")
    for writer in writers:
        _, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err[-2000:]
    seen = json.loads(run_reference("qwen_vl_tiny_forward.py", *dirs.values()))
    return {key: (d, seen[d]) for key, d in dirs.items()}


@shares_checkpoints
@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_transformers_loads_and_runs_what_the_cli_writes(checkpoints, arch):
    ckpt, seen = checkpoints[arch, "transformers"]
    architecture, model_type, processor, patch = ARCHES[arch]
    config = json.load(open(f"{ckpt}/config.json"))
    assert config["architectures"] == [architecture] and config["model_type"] == model_type
    assert config["vision_config"]["patch_size"] == patch and config["vision_config"]["temporal_patch_size"] == 2
    assert seen["processor"] == processor and seen["missing"] == [] and seen["unexpected"] == []
    # the decoder's vocabulary is padded past the tokenizer's, which ends with Qwen's special tokens
    assert seen["vocab_rows"] > seen["tokenizer_size"]
    tokenizer = json.load(open(f"{ckpt}/tokenizer.json"))
    added = [t["content"] for t in tokenizer["added_tokens"]]
    assert sorted(added) == sorted(QWEN_SPECIAL_TOKENS)
    assert min(t["id"] for t in tokenizer["added_tokens"]) >= seen["tokenizer_size"] - len(QWEN_SPECIAL_TOKENS)
    # generation_config: Qwen's two EOS ids (<|im_end|>, <|endoftext|>)
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    generation = json.load(open(f"{ckpt}/generation_config.json"))
    assert generation["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert config.get("image_token_id") == ids["<|image_pad|>"] and config["video_token_id"] == ids["<|video_pad|>"]
    # the processor expanded each pad token to t*h*w/4 of them
    (t, h, w), = seen["image_grid_thw"]
    assert seen["input_ids"].count(ids["<|image_pad|>"]) == t * h * w // 4
    (vt, vh, vw), = seen["video_grid_thw"]
    assert vt == 3  # 5 frames padded to 6, in pairs
    assert seen["input_ids"].count(ids["<|video_pad|>"]) == vt * vh * vw // 4
    assert all(abs(v) < 1e3 for v in seen["last_logits"])
    # norms and biases moved off one and zero, so a parity test sees one left out
    with safe_open(f"{ckpt}/model.safetensors", "pt") as f:
        norms = [f.get_tensor(n) for n in f.keys() if "norm" in n and n.endswith("weight")]
        biases = [f.get_tensor(n) for n in f.keys() if n.endswith("bias")]
    assert norms and all(not bool((t == 1).all()) for t in norms)
    assert all(not bool((t == 0).all()) for t in biases)


@shares_checkpoints
def test_qwen3_vl_writes_timestamps_and_its_video_processor(checkpoints):
    ckpt, seen = checkpoints["qwen3-vl", "transformers"]
    assert seen["video_processor"] == "Qwen3VLVideoProcessor"
    assert json.load(open(f"{ckpt}/video_preprocessor_config.json"))["patch_size"] == 16
    # frames 0..4 at 10 fps, in pairs (the last one repeated): the pairs' mean times
    assert all(f"<{t} seconds><|vision_start|>" in seen["expanded"] for t in ("0.1", "0.2", "0.4"))


@shares_checkpoints
def test_qwen2_5_vl_gives_seconds_per_grid(checkpoints):
    _, seen = checkpoints["qwen2.5-vl", "transformers"]
    assert seen["second_per_grid_ts"] == [pytest.approx(0.2)]  # 2 frames a patch at 10 sampled fps


@shares_checkpoints
@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_published_layout_is_the_same_model(checkpoints, arch):
    ckpt, seen = checkpoints[arch, "published"]
    _, saved = checkpoints[arch, "transformers"]
    config = json.load(open(f"{ckpt}/config.json"))
    with safe_open(f"{ckpt}/model.safetensors", "pt") as f:
        names = list(f.keys())
    if arch == "qwen3-vl":
        assert config["text_config"]["rope_scaling"]["mrope_interleaved"] is True
        assert any(n.startswith("model.language_model.") for n in names)
    else:  # flat, as Qwen2-VL and Qwen2.5-VL publish it
        assert "text_config" not in config and config["rope_scaling"]["type"] == "mrope"
        assert config["hidden_size"] == 64 and "vision_config" in config
        assert any(n.startswith("model.layers.") for n in names) and any(n.startswith("visual.") for n in names)
        assert not any(n.startswith("model.language_model.") for n in names)
    assert seen["missing"] == [] and seen["unexpected"] == []
    assert seen["input_ids"] == saved["input_ids"] and seen["last_logits"] == saved["last_logits"]


def test_cli_refuses_llava_parts_for_qwen(tmp_path):
    run = subprocess.run([sys.executable, "-m", "vlserve", "make-tiny-model", str(tmp_path), "--arch", "qwen2-vl",
                          "--text", "llama"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--arch qwen2-vl has its own" in run.stderr
