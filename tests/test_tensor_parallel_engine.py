"""Engine(tp_size=2) on the CPU (gloo, 2 processes) against tp_size=1: the same greedy tokens and
logits within 1e-4 at every step, for a GQA (Llama) and an MHA (Qwen2, biases) checkpoint and a
LLaVA-NeXT (anyres) one, on a batch with a text-only, a one-image and a two-image request (chunked so
images span steps), then a radix-cache hit and a vision-cache hit, then the same image after
/flush_cache; pixels are sent for new images only; start-up and shutdown leave no process behind.
A killed rank ends the running request with an error naming it, within seconds, and the engine
refuses new work."""

import io
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from PIL import Image

from helpers.tp_helpers import process_gone
from vlserve import Engine
from vlserve.core.errors import EngineBusy
from vlserve.distributed import step_message, tp_runner
from vlserve.testing.tiny import TinyModelSpec, make_tiny_model
from vlserve.testing.tiny_anyres import make_tiny_llava_next

pytestmark = pytest.mark.distributed

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
ENGINE = {"num_threads": 1, "max_total_tokens": 2048, "chunked_prefill_size": 24}
ONE_IMAGE = "USER: <image>\nWhat colour is it? ASSISTANT:"


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _checkpoint(tmp_path_factory, name: str, kv_heads: int, text: str = "llama", anyres: bool = False) -> str:
    spec = TinyModelSpec(num_heads=4, num_kv_heads=kv_heads, text=text)
    write = make_tiny_llava_next if anyres else make_tiny_model
    return write(str(tmp_path_factory.mktemp(name)), seed=5, spec=spec)


# GQA: a Llama decoder (no biases); MHA: a Qwen2 decoder (q/k/v biases, none on o); LLaVA-NeXT: anyres
# images (several views per image, of their own sizes) cross to the workers as the tower takes them
@pytest.fixture(scope="module", params=[("gqa", 2, "llama"), ("mha", 4, "qwen2"), ("next", 2, "llama", True)],
                ids=["gqa-llama", "mha-qwen2", "llava-next"])
def checkpoint(request, tmp_path_factory):
    return _checkpoint(tmp_path_factory, *request.param)


@pytest.fixture(scope="module")
def gqa_checkpoint(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "gqa-kill", 2)


def _run(model_dir: str, tp_size: int, monkeypatch) -> dict:
    sent = []  # the StepMessages rank 0 broadcast
    monkeypatch.setattr(tp_runner, "broadcast", lambda msg: sent.append(msg) or step_message.broadcast(msg))
    with Engine(model_dir, tp_size=tp_size, **ENGINE) as engine:
        steps = []
        forward = engine.runner.forward
        engine.runner.forward = lambda batch: steps.append(forward(batch).clone()) or steps[-1]
        first = engine.generate(prompt=["USER: Say hello to the fox. ASSISTANT:", ONE_IMAGE,
                                        "USER: <image> and <image>\nCompare them. ASSISTANT:"],
                                image_data=[None, [_png(1)], [_png(2), _png(3)]], sampling_params=GREEDY)
        again = engine.generate(prompt=[ONE_IMAGE + " It is", "USER: Other words first. <image>\nAnd? ASSISTANT:"],
                                image_data=[[_png(1)], [_png(2)]], sampling_params=GREEDY)
        assert engine.flush_cache()  # both caches emptied, on every rank: the image is encoded again
        flushed = engine.generate(prompt=ONE_IMAGE, image_data=[_png(1)], sampling_params=GREEDY)
        assert engine.wait_idle()
        engine.scheduler.cm.check_idle_accounting()
        pids = [p.pid for p in engine.tp_group.procs.values()] if engine.tp_group else []
        vision_hits = engine.metrics.vision_cache_hits._value.get()
    return {"ids": [o["output_ids"] for o in first + again + [flushed]], "steps": steps, "pids": pids,
            "cached": [o["meta_info"]["cached_tokens"] for o in again + [flushed]], "vision_hits": vision_hits,
            "pixels_sent": sum(len(m.new_images.pixels) for m in sent if m is not None)}


def test_tp2_equals_tp1_token_for_token_and_logits_within_1e_4(checkpoint, monkeypatch):
    one, two = _run(checkpoint, 1, monkeypatch), _run(checkpoint, 2, monkeypatch)
    assert two["ids"] == one["ids"] and two["ids"][-1] == two["ids"][1]
    assert two["cached"][0] > 16 and two["cached"] == one["cached"]  # the first request's prompt, image included
    assert two["cached"][-1] == 0
    assert two["vision_hits"] >= 1  # the second image again, after other words: its embedding from the cache
    assert two["pixels_sent"] == 4  # new images only: three, and the first again after the flush
    assert len(two["steps"]) == len(one["steps"])
    for i, (a, b) in enumerate(zip(one["steps"], two["steps"])):
        assert a.shape == b.shape, f"step {i}"
        assert torch.allclose(a, b, atol=1e-4, rtol=0), f"step {i}: max difference {(a - b).abs().max()}"
    assert len(two["pids"]) == 1
    assert all(process_gone(pid) for pid in two["pids"]), "a worker rank outlived the engine"
    assert not mp.active_children()


def test_a_killed_rank_fails_the_running_request_by_name_and_stops_the_engine(gqa_checkpoint):
    engine = Engine(gqa_checkpoint, tp_size=2, **ENGINE)
    try:
        result = {}
        long = threading.Thread(target=lambda: result.update(out=engine.generate(
            prompt="USER: Tell me a story. ASSISTANT:", sampling_params={"max_new_tokens": 1500, "ignore_eos": True})))
        long.start()
        time.sleep(1.0)
        worker = engine.tp_group.procs[1]
        os.kill(worker.pid, signal.SIGKILL)
        long.join(timeout=30)
        assert not long.is_alive(), "the running request hung after its rank died"
        out = result["out"]
        assert "tensor-parallel rank 1" in out["error"] and "SIGKILL" in out["error"], out
        assert "tensor-parallel rank 1" in engine.fatal_error and not engine.is_alive()
        with pytest.raises(EngineBusy, match="tensor-parallel rank 1"):
            engine.generate(prompt="hello", sampling_params={"max_new_tokens": 2})
    finally:
        engine.shutdown()
    assert not mp.active_children()
