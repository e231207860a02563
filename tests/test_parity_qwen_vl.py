"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL through the engine (scheduler, radix cache, paged pool, CPU kernels)
against transformers' ForConditionalGeneration classes, fp32: greedy ids, each step's logprob and the prefill's top-20
within 1e-4 — text only, one picture of odd size, two pictures of different sizes; page sizes 1 and
4; radix cache on and off; chunked prefill; and again from the cache, which then covers the media."""

import threading

import pytest
import torch

from helpers.qwen_helpers import ARCHS, build_req, hf_greedy, hf_inputs, make_qwen_vl, random_picture
from vlserve.engine.engine import Engine

STEPS = 12
TOL = 1e-4


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request, tmp_path_factory):
    return make_qwen_vl(str(tmp_path_factory.mktemp(request.param)), request.param, seed=3)


@pytest.fixture(scope="module")
def hf(checkpoint):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(checkpoint).eval()


def _prompts(cfg):
    image_token, patch = cfg.image_token_id, cfg.vision_hf_config.patch_size
    gen = torch.Generator().manual_seed(7)
    text = lambda n: torch.randint(5, 290, (n,), generator=gen).tolist()  # noqa: E731
    odd = random_picture((6, 10), gen, patch)  # 15 merged tokens: a 84x140 picture (96x160 in Qwen3-VL)
    small, tall = random_picture((4, 4), gen, patch), random_picture((8, 2), gen, patch)
    return {
        "text": (text(9), []),
        "one-odd-picture": (text(3) + [image_token] + text(6), [odd]),
        "two-pictures": (text(2) + [image_token] + text(3) + [image_token] + text(4), [small, tall]),
    }


def _run(engine: Engine, reqs) -> None:
    done = [threading.Event() for _ in reqs]
    for req, event in zip(reqs, done):
        req.sink = lambda out, e=event: out.finished and e.set()
    engine.submit(reqs)
    for event in done:
        assert event.wait(120), "request did not finish"
    for req in reqs:
        assert req.finish_reason == "length", req.finish_reason


def _assert_matches(req, ref_ids, ref_logprobs):
    assert req.output_ids == ref_ids
    for step, (token, lp, ref) in enumerate(zip(req.output_ids, req.output_logprobs, ref_logprobs)):
        assert abs(lp - float(ref[token])) < TOL, f"step {step}: {lp} vs {float(ref[token])}"
    top = req.output_top_logprobs[0]
    ref_values, ref_top = ref_logprobs[0].topk(20)
    assert [t for _, t in top] == ref_top.tolist()
    assert torch.allclose(torch.tensor([v for v, _ in top]), ref_values, atol=TOL)


@pytest.mark.parametrize("page_size,radix,chunk", [(1, True, 2048), (4, True, 2048), (1, False, 2048),
                                                   (4, True, 8)])
def test_engine_matches_transformers(checkpoint, hf, page_size, radix, chunk):
    with Engine(checkpoint, max_total_tokens=1024, page_size=page_size, disable_radix_cache=not radix,
                chunked_prefill_size=chunk) as engine:
        cfg = engine.loaded.config
        prompts = _prompts(cfg)
        refs = {name: hf_greedy(hf, hf_inputs(ids, pics, cfg), STEPS) for name, (ids, pics) in prompts.items()}
        first = [build_req(ids, pics, cfg, STEPS, rid=name) for name, (ids, pics) in prompts.items()]
        _run(engine, first)
        for req in first:
            _assert_matches(req, *refs[req.rid])
        again = [build_req(ids, pics, cfg, STEPS, rid=name) for name, (ids, pics) in prompts.items()]
        _run(engine, again)  # the same prompts: from the cache when it is on
        for req in again:
            _assert_matches(req, *refs[req.rid])
            if radix:
                assert req.cached_tokens >= len(req.input_ids) - page_size, (req.rid, req.cached_tokens)
                assert all(span.end <= req.cached_tokens for span in req.images)
            else:
                assert req.cached_tokens == 0


def test_decode_positions_follow_the_picture(checkpoint):
    """Tokens after a 6x10-merged-patch... picture continue from its spatial extent, not the token count."""
    with Engine(checkpoint, max_total_tokens=256) as engine:
        cfg = engine.loaded.config
        ids, pics = _prompts(cfg)["one-odd-picture"]
        req = build_req(ids, pics, cfg, 2)
        n = len(req.input_ids)
        assert n == 3 + 15 + 6
        # text after the picture resumes at 3 + max(3, 5); generated tokens continue from there
        assert req.mrope.prompt[:, 18].tolist() == [8] * 3
        assert req.mrope.rows(n, n + 1).tolist() == [[8 + 6]] * 3
