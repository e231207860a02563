"""benchmarks/workloads.py's peer settings: the KV space each system is given, the llama.cpp systems a sweep
expands to, the requests llama-server receives, and the workloads scaled for large models.

Bugs caught: vLLM given a KV space of other bytes than vlserve's pool for the same tokens (a per-layer or
dtype factor lost); a sweep that runs one llama.cpp setting under another's name; a /completion prompt whose
media markers do not match its images (llama-server refuses it, or places frames at the wrong text);
`--scale 1` changing the workloads every recorded figure was measured on; a llama.cpp that is not built
passing as a run instead of a skip that says how to build it.
"""

import json
import shutil
from dataclasses import replace

import pytest
import torch
from transformers import AutoConfig

from vlserve.bench import workload_defs as W
from vlserve.bench.kv_space import context_length, kv_bytes_per_token
from vlserve.bench.llamacpp import MEDIA_MARKER, LlamaCppSetup, completion_body, prepare, run_llamacpp
from vlserve.memory.pools import KVShape
from vlserve.model.config import model_config_from_hf
from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

from helpers.bench_script_helpers import load_benchmark_script

harness = load_benchmark_script("workloads")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    spec = TinyModelSpec(text="qwen2", num_layers=3, num_heads=4, num_kv_heads=2, hidden_size=64, image_size=32)
    return make_tiny_model(str(tmp_path_factory.mktemp("peer-settings")), seed=1, spec=spec)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vllm_kv_bytes_are_vlserves_pool_bytes_per_token(model_dir, dtype):
    text = model_config_from_hf(AutoConfig.from_pretrained(model_dir)).text
    pool = KVShape(text.num_layers, text.num_kv_heads, text.head_dim, getattr(torch, dtype)).bytes_per_slot
    assert kv_bytes_per_token(model_dir, dtype) == pool
    assert context_length(model_dir) == text.max_position_embeddings


def test_a_llamacpp_sweep_is_one_named_system_per_setting():
    peers = harness.PeerOptions(kv_tokens=8192, llamacpp=LlamaCppSetup(build_dir="/b", shared_dir="/s"),
                                llamacpp_runs=(("bf16", 2), ("bf16", 8), ("q8_0", 4)))
    systems = peers.expand(["vlserve-lpm", "llamacpp", "vllm"])
    assert systems == ["vlserve-lpm", "llamacpp-bf16-p2", "llamacpp-bf16-p8", "llamacpp-q8_0-p4", "vllm"]
    setup = peers.llamacpp_setup("llamacpp-q8_0-p4", threads=2)
    assert (setup.weight_type, setup.parallel, setup.threads, setup.ctx_tokens, setup.build_dir, setup.shared_dir) \
        == ("q8_0", 4, 2, 8192, "/b", "/s")


def test_completion_requests_carry_one_marker_per_image_or_frame():
    image_job = W.questions_per_image(images=1, questions=1)[0]
    video_job = W.video_qa(videos=1, questions=1, frames=4)[0]
    text_job = W.few_shot(n=1, examples=1)[0]
    for job, images in ((image_job, 1), (video_job, 4)):
        p = prepare(job, video_frames=4)
        assert p.prompt.count(MEDIA_MARKER) == len(p.images_b64) == images
        assert "<image>" not in p.prompt and "<video>" not in p.prompt
        body = completion_body(p)
        assert body["prompt"]["multimodal_data"] == p.images_b64 and body["n_predict"] == job.max_new_tokens
        assert body["ignore_eos"] and body["temperature"] == 0.0 and body["cache_prompt"]
    body = completion_body(prepare(text_job, video_frames=4))
    assert body["prompt"] == text_job.prompt  # a text prompt goes as a plain string


def test_scale_one_is_each_workload_as_defined_and_scaling_keeps_the_shape():
    for name, make in W.WORKLOADS.items():
        defined, same = make(), W.scaled(name, 1.0)
        assert [(j.prompt, j.images, j.videos) for j in same] == [(j.prompt, j.images, j.videos) for j in defined]
    assert len(W.scaled("few_shot", 0.25)) == 6 and len(W.scaled("questions_per_image", 0.5)) == 12
    assert len(W.scaled("tree_of_thought", 0.5)) == 3 + 9  # two levels of three branches


def test_llamacpp_not_built_is_a_skip_naming_the_build_script(tmp_path, model_dir):
    setup = LlamaCppSetup(build_dir=str(tmp_path / "none"), shared_dir="/work/shared/peers")
    with pytest.raises(FileNotFoundError, match=r"llamacpp\.sh"):
        run_llamacpp(model_dir, W.few_shot(n=1, examples=1), setup=setup)


def test_a_compressed_checkpoint_gives_llamacpp_the_one_it_was_quantized_from(tmp_path, model_dir, capsys):
    """llama.cpp's converter reads full-precision weights: beside a compressed-tensors --model it converts
    --llamacpp-model, and without one the run is refused (in the script, and by run_llamacpp)."""
    compressed = tmp_path / "w8a8"
    shutil.copytree(model_dir, compressed)
    config = json.loads((compressed / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors"}
    (compressed / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit):
        harness.main(["--systems", "vlserve-lpm,llamacpp", "--model", str(compressed), "--workload", "few_shot",
                      "--out", str(tmp_path / "out")])
    assert "give llama.cpp the full-precision one it was quantized from (--llamacpp-model)" in capsys.readouterr().err
    setup = LlamaCppSetup(build_dir=str(tmp_path / "none"), shared_dir="/work/shared/peers")
    reqs = W.few_shot(n=1, examples=1)
    with pytest.raises(ValueError, match="--llamacpp-model"):
        run_llamacpp(str(compressed), reqs, setup=setup)
    with pytest.raises(FileNotFoundError, match=r"llamacpp\.sh"):  # past the check, to the (missing) build
        run_llamacpp(str(compressed), reqs, setup=replace(setup, source_model=model_dir))


def test_unknown_llamacpp_type_is_refused(capsys):
    with pytest.raises(SystemExit):
        harness.main(["--systems", "llamacpp", "--llamacpp-type", "q3_weird", "--workload", "few_shot"])
    assert "unknown --llamacpp-type 'q3_weird'" in capsys.readouterr().err
