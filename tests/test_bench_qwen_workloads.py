"""The workloads benchmark's Qwen2.5-VL family (bench/qwen_workloads.py, bench/qwen_peers.py): every
workload's prompts in the markup Qwen's chat template writes, with the same media; vLLM's request
entries (pictures as their bytes, a video as vlserve's sampled frames with vLLM's metadata); the
peers that do not serve the family refused by name."""

import json
import os
import sys

import jinja2
import numpy as np
import pytest

from vlserve.bench import workload_defs as W
from vlserve.bench.qwen_peers import vllm_request
from vlserve.bench.qwen_workloads import FAMILY, family_workload, qwen_prompt
from vlserve.testing.tiny_qwen_vl import QWEN2_VL_CHAT_TEMPLATE

SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"  # the template's default turn, left out


def render(messages: list[dict]) -> str:
    return jinja2.Template(QWEN2_VL_CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)


def test_multi_turn_prompt_is_what_the_chat_template_writes():
    job = W.multi_turn_chat(sessions=1, turns=3)[2]  # a picture, three answered turns, a new question
    turns = job.prompt.removesuffix(" ASSISTANT:").split("</s>")
    messages = []
    for n, turn in enumerate(turns):
        question, _, answer = turn.removeprefix("USER: ").partition(" ASSISTANT: ")
        text = {"type": "text", "text": question.removeprefix("<image>\n")}
        content = [{"type": "image"}, text] if n == 0 else [text]
        messages.append({"role": "user", "content": content})
        if answer:
            messages.append({"role": "assistant", "content": answer})
    assert len(messages) == 7
    assert SYSTEM + qwen_prompt(job.prompt) == render(messages)


@pytest.mark.parametrize("name", list(W.WORKLOADS))
def test_every_workload_keeps_its_media_and_loses_the_llava_markup(name):
    llava, qwen = W.scaled(name, 0.5), family_workload(FAMILY, name, 0.5)
    assert [(j.images, j.videos, j.max_new_tokens) for j in llava] == [(j.images, j.videos, j.max_new_tokens)
                                                                      for j in qwen]
    for job in qwen:
        assert not any(m in job.prompt for m in ("<image>", "<video>", "USER:", "ASSISTANT:", "</s>"))
        assert job.prompt.count("<|image_pad|>") == len(job.images)
        assert job.prompt.count("<|video_pad|>") == len(job.videos)
    assert family_workload("llava", name, 0.5) == llava


def test_vllm_request_entries(tmp_path):
    job = family_workload(FAMILY, "video_qa", 0.34)[0]
    entry = vllm_request(job, str(tmp_path), "r0", video_frames=8)
    assert entry["prompt"] == job.prompt and entry["images"] == [] and entry["max_new_tokens"] == W.NEW_TOKENS
    (video,) = entry["videos"]
    assert np.load(video["frames"]).shape == (8, 64, 64, 3)  # workload_defs' clip: 8 frames of 64 px at 4 fps
    assert video["metadata"] == {"fps": 4.0, "duration": 2.0, "total_num_frames": 8, "frames_indices": list(range(8)),
                                 "video_backend": "pyav"}
    json.dumps(entry)  # the spec file vllm_offline.py reads
    picture = family_workload(FAMILY, "questions_per_image", 0.25)[0]
    entry = vllm_request(picture, str(tmp_path), "r1", video_frames=8)
    with open(entry["images"][0], "rb") as f:
        assert f.read() == picture.images[0]


def test_peers_without_the_family_are_refused(capsys):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import workloads

    with pytest.raises(SystemExit) as exit_:
        workloads.main(["--family", FAMILY, "--systems", "vlserve-lpm,transformers", "--out", "/nonexistent"])
    assert exit_.value.code == 2
    assert "not transformers" in capsys.readouterr().err
