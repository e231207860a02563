"""End to end through the Engine: cache on/off equality under every policy and page size, memory
pressure (eviction + retraction), chunked prefill, aborts, and no leaked slot after any run."""

import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from vlserve import Engine
from vlserve.testing.tiny import make_tiny_model

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("e2e")), seed=7)


def _png(seed: int, size=(40, 30)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _workload():
    """Few-shot style prompts sharing prefixes, several questions per image, and unrelated ones."""
    shared = "USER: You are a careful assistant. Answer briefly. Example: the quick brown fox. "
    prompts, images = [], []
    for i in range(4):
        prompts.append(shared + f"Question {i}: what is {i} plus {i}? ASSISTANT:")
        images.append(None)
    for q in ("What colour?", "How many shapes?", "Where is it?"):
        prompts.append(f"USER: <image>\n{q} ASSISTANT:")
        images.append([_png(1)])
    prompts.append("USER: <image>\nWhat colour? ASSISTANT:")
    images.append([_png(2)])  # same size, different pixels: must not hit the first image's KV
    prompts.append("Once upon a time")
    images.append(None)
    return prompts, images


def _run(model_dir, **kwargs):
    prompts, images = _workload()
    with Engine(model_dir, **{"max_total_tokens": 4096, **kwargs}) as engine:
        outs = engine.generate(prompt=prompts, image_data=images, sampling_params=GREEDY)
        assert engine.wait_idle()
        engine.scheduler.cm.check_idle_accounting()
        return outs, engine.metrics


@pytest.fixture(scope="module")
def reference(model_dir):
    outs, _ = _run(model_dir, disable_radix_cache=True, schedule_policy="fcfs")
    assert all(o["meta_info"]["cached_tokens"] == 0 for o in outs)
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight", "fcfs", "random"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_cache_on_equals_cache_off(model_dir, reference, policy, page_size):
    outs, metrics = _run(model_dir, schedule_policy=policy, page_size=page_size)
    assert [o["output_ids"] for o in outs] == reference
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    assert sum(cached) > 0
    assert metrics.value(metrics.cached_prompt_tokens) == sum(cached)


def test_matches_transformers_greedy(model_dir, reference):
    """Invariant 3: the engine's greedy output equals transformers' generate on the same checkpoint."""
    from transformers import LlavaForConditionalGeneration

    hf = LlavaForConditionalGeneration.from_pretrained(model_dir).eval()
    hf.generation_config.eos_token_id = None  # as ignore_eos: EOS is just another token
    prompts, images = _workload()
    with Engine(model_dir, max_total_tokens=4096) as engine:
        for i in (0, 4, 7, 8):
            req = engine.make_request(prompt=prompts[i], image_data=images[i])
            image_id = engine.loaded.config.image_token_id
            ids = [image_id if t >= engine.runner.vocab_size else t for t in req.input_ids]
            kwargs = {}
            if req.images:
                kwargs["pixel_values"] = torch.from_numpy(np.stack([s.pixel_values for s in req.images]))
            out = hf.generate(input_ids=torch.tensor([ids]), max_new_tokens=12, do_sample=False, **kwargs)
            assert out[0, len(ids):].tolist() == reference[i], f"prompt {i}"


def test_memory_pressure_evicts_and_retracts(model_dir, reference):
    """A pool far smaller than the batch forces eviction and retraction; outputs do not change."""
    outs, _ = _run(model_dir, max_total_tokens=160, new_token_ratio=0.0, max_running_requests=8)
    assert [o["output_ids"] for o in outs] == reference


def test_retraction_happens_under_pressure(model_dir):
    prompts = [f"USER: tell me story number {i} about a long road ASSISTANT:" for i in range(6)]
    params = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    with Engine(model_dir, max_total_tokens=128, new_token_ratio=0.0) as engine:
        retracted = []
        orig = engine.scheduler._retract
        engine.scheduler._retract = lambda req: (retracted.append(req.rid), orig(req))
        outs = engine.generate(prompt=prompts, sampling_params=params)
        assert engine.wait_idle()
        engine.scheduler.cm.check_idle_accounting()
    assert retracted, "the pool was large enough that nothing was retracted"
    assert all(o["meta_info"]["completion_tokens"] == 24 for o in outs)
    with Engine(model_dir, max_total_tokens=4096) as engine:
        alone = engine.generate(prompt=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in alone]


@pytest.mark.slow
def test_triton_backend_matches_torch_backend(model_dir, reference):
    """The paged Triton kernels (in the interpreter on CPU) give the torch backend's greedy output."""
    outs, _ = _run(model_dir, attention_backend="triton", page_size=4, chunked_prefill_size=16)
    assert [o["output_ids"] for o in outs] == reference


def test_chunked_prefill_matches(model_dir, reference):
    outs, _ = _run(model_dir, chunked_prefill_size=7)
    assert [o["output_ids"] for o in outs] == reference


def test_prefill_only_request_caches_the_prompt(model_dir):
    with Engine(model_dir, max_total_tokens=4096) as engine:
        prompt = "USER: <image>\nA long shared system prompt that should be cached. "
        hint = engine.generate(prompt=prompt, image_data=_png(3), sampling_params={"max_new_tokens": 0})
        assert hint["output_ids"] == [] and hint["meta_info"]["finish_reason"] == "length"
        out = engine.generate(prompt=prompt + "What is it? ASSISTANT:", image_data=_png(3),
                              sampling_params={"max_new_tokens": 4})
        assert out["meta_info"]["cached_tokens"] >= hint["meta_info"]["prompt_tokens"] - 1
        # the image's rows were all cached, so the tower did not run again
        assert engine.metrics.value(engine.metrics.vision_encoder_images) == 1


def test_vision_cache_skips_tower_after_a_different_prefix(model_dir):
    with Engine(model_dir, max_total_tokens=4096) as engine:
        engine.generate(prompt="<image>\nWhat?", image_data=_png(5), sampling_params={"max_new_tokens": 2})
        engine.generate(prompt="A different start. <image>\nWhat?", image_data=_png(5),
                        sampling_params={"max_new_tokens": 2})
        assert engine.metrics.value(engine.metrics.vision_encoder_images) == 1
        assert engine.metrics.value(engine.metrics.vision_cache_hits) == 1


def test_different_image_same_size_never_hits(model_dir):
    with Engine(model_dir, max_total_tokens=4096) as engine:
        a = engine.generate(prompt="<image>\nWhat?", image_data=_png(10), sampling_params={"max_new_tokens": 2})
        b = engine.generate(prompt="<image>\nWhat?", image_data=_png(11), sampling_params={"max_new_tokens": 2})
        c = engine.generate(prompt="<image>\nSomething else entirely", image_data=_png(10),
                            sampling_params={"max_new_tokens": 2})
        tpi = engine.loaded.config.tokens_per_image
    assert a["meta_info"]["cached_tokens"] == 0
    assert b["meta_info"]["cached_tokens"] <= 1  # at most the BOS token
    assert c["meta_info"]["cached_tokens"] >= tpi  # image first, new text: the image's KV is reused


def test_abort_waiting_and_running_frees_everything(model_dir):
    with Engine(model_dir, max_total_tokens=4096, max_running_requests=2) as engine:
        reqs = [engine.make_request(prompt=f"USER: story {i} ASSISTANT:",
                                    sampling_params={"max_new_tokens": 200, "ignore_eos": True}) for i in range(4)]
        done = {r.rid: threading.Event() for r in reqs}
        decoding = threading.Event()  # reqs[1] has produced a token: it is running, not waiting
        reasons = {}

        def sink_for(rid):
            def sink(out):
                if rid == reqs[1].rid and out.new_ids:
                    decoding.set()
                if out.finished:
                    reasons[rid] = out.finish_reason
                    done[rid].set()
            return sink

        for r in reqs:
            r.sink = sink_for(r.rid)
        engine.submit(reqs)
        assert decoding.wait(30)  # not a sleep: the abort below must hit a running request
        for r in reqs[1:]:  # one running request aborted, two waiting ones too (max_running_requests=2)
            engine.abort(r.rid)
        for event in done.values():
            assert event.wait(30)
        assert engine.wait_idle()
        engine.scheduler.cm.check_idle_accounting()
    assert reasons[reqs[0].rid] == "length"
    assert all(reasons[r.rid] == "abort" for r in reqs[1:])


def test_api_shapes_logprobs_stops_and_seed(model_dir):
    with Engine(model_dir, max_total_tokens=4096) as engine:
        out = engine.generate(input_ids=[1, 20, 30, 40], sampling_params={"max_new_tokens": 5, "temperature": 0},
                              return_logprob=True)
        lps = out["meta_info"]["output_token_logprobs"]
        assert [t for _, t in lps] == out["output_ids"] and all(lp <= 0 for lp, _ in lps)
        first = out["output_ids"][0]
        stopped = engine.generate(input_ids=[1, 20, 30, 40], sampling_params={
            "max_new_tokens": 5, "temperature": 0, "stop_token_ids": [first]})
        assert stopped["output_ids"] == [first] and stopped["meta_info"]["finish_reason"] == "stop"
        text = engine.generate(prompt="Hello", sampling_params={**GREEDY, "max_new_tokens": 8})["text"]
        stop = text[2:4]
        assert len(stop) == 2
        cut = engine.generate(prompt="Hello", sampling_params={"max_new_tokens": 8, "temperature": 0, "stop": stop})
        assert cut["text"] == text[:text.find(stop)]
        kw = {"max_new_tokens": 8, "temperature": 1.0, "seed": 42, "ignore_eos": True}
        a = engine.generate(prompt="Hello", sampling_params=kw)
        b = engine.generate(prompt="Hello", sampling_params=kw)
        assert a["output_ids"] == b["output_ids"]
        batch = engine.generate(prompt=["a", "b"], sampling_params=[{"max_new_tokens": 1},
                                                                   {"max_new_tokens": 3, "ignore_eos": True}])
        assert [o["meta_info"]["completion_tokens"] for o in batch] == [1, 3]


def test_input_logprobs_from_logprob_start_len(model_dir):
    """Prompt logprobs equal the log-softmax of transformers' logits, even when the prompt is cached."""
    from transformers import LlavaForConditionalGeneration

    hf = LlavaForConditionalGeneration.from_pretrained(model_dir).eval()
    ids = [1, 40, 41, 42, 43, 44, 45, 46, 47]
    with Engine(model_dir, max_total_tokens=4096, chunked_prefill_size=4) as engine:
        engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})  # now cached
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1}, return_logprob=True,
                              logprob_start_len=3)
        assert engine.wait_idle()
        engine.scheduler.cm.check_idle_accounting()
    got = out["meta_info"]["input_token_logprobs"]
    assert [t for _, t in got] == ids[3:]
    ref = torch.log_softmax(hf(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    expected = [ref[q - 1, ids[q]].item() for q in range(3, len(ids))]
    assert np.allclose([lp for lp, _ in got], expected, atol=1e-4)
    assert out["meta_info"]["cached_tokens"] <= 3
