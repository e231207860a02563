"""Qwen-VL with tensor parallelism 2 (gloo, 2 processes) against one process: every forward's logits
within 1e-4 and the same greedy ids, for Qwen3-VL (q/k norms sharded with their heads, DeepStack,
interleaved M-RoPE; its tower on each rank) with pictures, chunked so pictures span steps, then a
radix-cache hit. The M-RoPE positions cross to the worker rank in the step message ([3, T]).
(Qwen2.5-VL passed too when run; one family keeps the suite short: the TP path is shared.)"""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from vlserve.engine.engine import Engine
from vlserve.testing.tiny_qwen_vl import make_tiny_qwen_vl

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
ENGINE = {"num_threads": 1, "max_total_tokens": 2048, "chunked_prefill_size": 24}


def _png(seed: int, size=(70, 45)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _run(path: str, tp_size: int) -> tuple[list, list, list]:
    pad = "<|vision_start|><|image_pad|><|vision_end|>"
    with Engine(path, tp_size=tp_size, **ENGINE) as engine:
        steps = []
        forward = engine.runner.forward
        engine.runner.forward = lambda batch: steps.append(forward(batch).clone()) or steps[-1]
        first = engine.generate(prompt=["Say hello.", f"{pad}What is it?", f"{pad} and {pad} compared:"],
                                image_data=[None, [_png(1)], [_png(2), _png(3, (30, 100))]], sampling_params=GREEDY)
        again = engine.generate(prompt=f"{pad}What is it? It is", image_data=[_png(1)], sampling_params=GREEDY)
    return [o["output_ids"] for o in first + [again]], steps, [again["meta_info"]["cached_tokens"]]


def test_tp2_equals_tp1(tmp_path):
    path = make_tiny_qwen_vl(str(tmp_path), "qwen3-vl", seed=4)
    one, two = _run(path, 1), _run(path, 2)
    assert two[0] == one[0]
    assert two[2] == one[2] and two[2][0] > 0  # the picture's KV from the cache on both
    assert len(two[1]) == len(one[1])
    for i, (a, b) in enumerate(zip(one[1], two[1])):
        assert a.shape == b.shape, f"step {i}"
        assert torch.allclose(a, b, atol=1e-4, rtol=0), f"step {i}: max difference {(a - b).abs().max()}"
