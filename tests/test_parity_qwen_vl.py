"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL through the engine (scheduler, radix cache, paged pool, CPU kernels)
against transformers' ForConditionalGeneration classes, fp32: greedy ids, each step's logprob and the prefill's top-20
within 1e-4 — text only, one picture of odd size, two pictures of different sizes, a video, a picture
with a video; page sizes 1 and 4; radix cache on and off; chunked prefill; and again from the cache,
which then covers the media."""

import threading

import pytest
import torch

from helpers.qwen_helpers import (
    ARCHS, SPECIAL, build_req, hf_greedy, hf_inputs, make_qwen_vl, random_picture, video_pad,
)
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
    """Name → (ids with one pad per picture / video pad, the media in order)."""
    image, video, patch = cfg.image_token_id, cfg.video_token_id, cfg.vision_hf_config.patch_size
    gen = torch.Generator().manual_seed(7)
    text = lambda n: torch.randint(len(SPECIAL), 290, (n,), generator=gen).tolist()  # noqa: E731
    picture = lambda h, w: random_picture((h, w), gen, patch)  # noqa: E731
    odd = picture(6, 10)  # 15 merged tokens: an 84x140 picture (96x160 in Qwen3-VL)
    small, tall = picture(4, 4), picture(8, 2)
    # a video of 5 frame pairs on a 4x6 grid, longer in time than in space; 0.8 s a pair (Qwen2.5-VL)
    frames = [picture(4, 6) for _ in range(5)]
    if cfg.text.mrope_interleaved:  # Qwen3-VL: each pair its own pad after its timestamp's tokens
        video_ids = [t for _ in frames for t in text(3) + [video]]
        pads = [video_pad([f]) for f in frames]
    else:
        video_ids, pads = [video], [video_pad(frames, 0.8)]
    return {
        "text": (text(9), []),
        "one-odd-picture": (text(3) + [image] + text(6), [odd]),
        "two-pictures": (text(2) + [image] + text(3) + [image] + text(4), [small, tall]),
        "video": (text(2) + video_ids + text(5), pads),
        "picture-and-video": (text(2) + [image] + text(2) + video_ids + text(3), [tall, *pads]),
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
                # the cache covers the media but the prompt's last page (page_size > 1: it is not shared)
                assert all(span.end <= req.cached_tokens for span in req.images
                           if span.end <= len(req.input_ids) - page_size)
            else:
                assert req.cached_tokens == 0


def test_generated_positions_go_on_from_the_prompt(checkpoint):
    """Qwen2-VL / Qwen2.5-VL: after a video longer in time (5 pairs) than in space (2x3 merged), text
    resumes at the video's start + 3; every family: generated tokens go on from the prompt's last
    position, as generate() places them."""
    with Engine(checkpoint, max_total_tokens=256) as engine:
        cfg = engine.loaded.config
        ids, media = _prompts(cfg)["video"]
        req = build_req(ids, media, cfg, 2)
        n = len(req.input_ids)
        last = req.mrope.prompt[0, -1].item()
        assert req.mrope.prompt[:, -1].tolist() == [last] * 3
        assert req.mrope.rows(n, n + 2).tolist() == [[last + 1, last + 2]] * 3
        if not cfg.text.mrope_interleaved:
            assert n == 2 + 5 * 6 + 5
            temporal = [0, 1, 2, 3, 4] if cfg.mrope.tokens_per_second is None else [0, 1, 3, 4, 6]  # 1.6 a pair
            assert req.mrope.prompt[0, 2:32:6].tolist() == [2 + t for t in temporal]
            assert req.mrope.prompt[:, 32].tolist() == [5] * 3 and last == 9


@pytest.fixture(scope="module")
def qwen2_vl(tmp_path_factory):
    from transformers import AutoModelForImageTextToText

    path = make_qwen_vl(str(tmp_path_factory.mktemp("keys")), "qwen2-vl", seed=5)
    return path, AutoModelForImageTextToText.from_pretrained(path).eval()


def test_videos_sharing_first_frames_share_their_kv(qwen2_vl):
    """Two videos with the same first 8 frames (4 pairs) share those pairs' KV; a clip extended by new
    frames reuses the old frames' KV; a still picture of a video's frame pair never takes its key. Each
    answer still matches transformers. (One family: the keys are the same code for all three.)"""
    checkpoint, hf = qwen2_vl
    with Engine(checkpoint, max_total_tokens=1024) as engine:
        cfg = engine.loaded.config
        gen = torch.Generator().manual_seed(11)
        pair = lambda: random_picture((4, 6), gen)  # noqa: E731
        shared, first_tail, second_tail = [pair() for _ in range(4)], [pair()], [pair(), pair()]
        prefix = [7, 8, 9]
        video_a = (prefix + [cfg.video_token_id, 10], [video_pad(shared + first_tail)])
        video_b = (prefix + [cfg.video_token_id, 10], [video_pad(shared + second_tail)])
        clip = (prefix + [cfg.video_token_id, 10], [video_pad(shared)])
        picture = (prefix + [cfg.image_token_id, 10], [shared[0]])
        shared_end = len(prefix) + 4 * 6
        for i, (ids, media) in enumerate([clip, video_a, video_b, picture]):
            req = build_req(ids, media, cfg, 3, rid=f"r{i}")
            _run(engine, [req])
            ref_ids, ref_logprobs = hf_greedy(hf, hf_inputs(ids, media, cfg), 3)
            _assert_matches(req, ref_ids, ref_logprobs)
            if i in (1, 2):  # the 4 shared pairs' KV came from the cache, nothing after them
                assert req.cached_tokens == shared_end, (i, req.cached_tokens)
            else:  # the first request; the picture shares only the text before it
                assert req.cached_tokens == (0 if i == 0 else len(prefix)), (i, req.cached_tokens)

