"""Qwen-VL through the whole engine from a text prompt and picture or video bytes: the chat template's
`<|vision_start|><|image_pad|><|vision_end|>` expanded by the picture's grid (prompt_tokens equals
transformers' expanded length; a video per frame pair, Qwen3-VL's after its timestamp), the
checkpoint's Qwen-VL processing, the router's keys, and greedy ids equal to
transformers' on the same pixels — for make-tiny-model's checkpoints of all three, as transformers
saves them and in the published layout (Qwen2-VL / Qwen2.5-VL: flat config, `rope_scaling: mrope`,
`model.layers.*` / `visual.*`; the vocabulary padded past the tokenizer; EOS from generation_config)."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.qwen_helpers import assert_matches, hf_greedy, run_reqs
from helpers.server_helpers import lossless_video, mp4
from vlserve.engine.engine import Engine
from vlserve.testing.tiny_qwen_vl import make_tiny_qwen_vl

STEPS = 8


def _png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("arch,layout", [("qwen2-vl", "published"), ("qwen2.5-vl", "transformers"),
                                         ("qwen3-vl", "published")])
def test_prompt_with_pictures_matches_transformers(tmp_path, arch, layout):
    from transformers import AutoModelForImageTextToText

    path = make_tiny_qwen_vl(str(tmp_path), arch, seed=2, layout=layout)
    pictures = [_png(97, 61, 1), _png(40, 150, 2)]  # odd sizes; the second below min_pixels on one side
    with Engine(path, max_total_tokens=1024) as engine:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the image?"},
                                                  {"type": "image"}, {"type": "text", "text": "And this one?"}]}]
        prompt = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out = engine.generate(prompt=prompt, image_data=pictures,
                              sampling_params={"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True})
        cfg, processing = engine.loaded.config, engine.loaded.image_processing
        assert cfg.text.eos_token_ids[:1] == (engine.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
        assert len(cfg.text.eos_token_ids) == 2  # <|endoftext|> from generation_config.json
        items = [processing.process(Image.open(io.BytesIO(p)).convert("RGB")) for p in pictures]
        ids = engine.tokenizer(prompt)["input_ids"]
    queue, expanded = list(items), []
    for t in ids:  # as transformers' processor expands each <|image_pad|>
        expanded += [t] * (queue.pop(0).num_tokens if t == cfg.image_token_id else 1)
    assert out["meta_info"]["prompt_tokens"] == len(expanded)
    hf = AutoModelForImageTextToText.from_pretrained(path).eval()
    inputs = {"input_ids": torch.tensor([expanded]),
              "mm_token_type_ids": torch.tensor([[int(t == cfg.image_token_id) for t in expanded]]),
              "pixel_values": torch.cat([torch.from_numpy(i.rows) for i in items]),
              "image_grid_thw": torch.tensor([i.grid_thw for i in items])}
    ref = hf.generate(**inputs, max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS)
    assert out["output_ids"] == ref[0, len(expanded):].tolist()


def test_router_key_is_the_engines_radix_key(tmp_path):
    """The router keys a Qwen-VL request as its engine does: the picture's grid of pseudo tokens."""
    import base64
    import json

    from vlserve.router.keys import RouteKeys
    from vlserve.router.model_files import ModelFiles

    path = make_tiny_qwen_vl(str(tmp_path), "qwen2-vl", seed=1)
    uri = "data:image/png;base64," + base64.b64encode(_png(97, 61, 3)).decode()
    body = {"text": "<|vision_start|><|image_pad|><|vision_end|>Describe it.", "image_data": uri}
    got = RouteKeys(ModelFiles.read(path)).key("/generate", json.dumps(body).encode())
    with Engine(path, max_total_tokens=1024) as engine:
        expected = engine.tokenize(prompt=body["text"], image_data=[uri])
        # 97x61 -> smart_resize 84x56 -> a 4x6 patch grid -> 6 merged tokens
        assert sum(t >= engine.loaded.config.text.vocab_size for t in expected) == 6
    assert got == expected


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_triton_path_matches_the_cpu_kernel(tmp_path, arch):
    """--attention-backend triton (Triton's interpreter without a GPU) over M-RoPE positions gives the
    torch backend's greedy ids and logits within 1e-4 for a picture with a video (Qwen2.5-VL: seconds
    per temporal patch; Qwen3-VL: timestamps, interleaved sections, DeepStack), prefill in chunks over
    pages of 4 and decode. The rotary takes the [3, T] positions on both paths (model/llama.py); the
    Triton kernels read the KV it wrote through the paged pool."""
    path = make_tiny_qwen_vl(str(tmp_path), arch, seed=6)
    results, chunk = [], 16
    prompt, params = VIDEO_PROMPTS["picture-and-video"][0], {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
    for backend in ("torch", "triton"):
        with Engine(path, max_total_tokens=1024, attention_backend=backend, page_size=4,
                    chunked_prefill_size=chunk) as engine:
            steps = []
            forward = engine.runner.forward
            engine.runner.forward = lambda batch: steps.append((batch.positions.clone(), forward(batch).clone())) \
                or steps[-1][1]
            out = engine.generate(prompt=prompt, image_data=[_png(60, 90, 4)], video_data=[mp4(6, 48)],
                                  sampling_params=params)
            results.append((out["output_ids"], steps))
            prompt_tokens = out["meta_info"]["prompt_tokens"]
    (ids_cpu, steps_cpu), (ids_triton, steps_triton) = results
    assert prompt_tokens > 2 * chunk and len(steps_cpu) == -(-prompt_tokens // chunk) + 2  # chunks, 2 decodes
    assert ids_triton == ids_cpu and len(steps_triton) == len(steps_cpu)
    for (pos_a, a), (pos_b, b) in zip(steps_cpu, steps_triton):
        assert pos_a.dim() == 2 and pos_a.shape[0] == 3 and torch.equal(pos_a, pos_b)  # M-RoPE rows
        assert torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()
    # the media's rows do not count one position per token: the three axes part somewhere
    assert any(not torch.equal(pos[0], pos[1]) for pos, _ in steps_cpu)


VIDEO_PROMPTS = {  # name → (prompt, with a picture)
    "video": ("<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>What happens?<|im_end|>\n"
              "<|im_start|>assistant\n", False),
    "picture-and-video": ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>and"
                          "<|vision_start|><|video_pad|><|vision_end|>What happens?<|im_end|>\n<|im_start|>assistant\n",
                          True),
}


def _expected_text(prompt: str, image, video, info, qwen3: bool) -> str:
    """The prompt as transformers' processor expands it: each pad repeated by its tokens; Qwen3-VL
    writes a `<t seconds>` text and its own vision start/pad/end per frame pair, t the mean time of
    the pair's two frames (the last frame repeated to fill an odd pair)."""
    text = prompt.replace("<|image_pad|>", "<|image_pad|>" * image.num_tokens)
    if not qwen3:
        return text.replace("<|video_pad|>", "<|video_pad|>" * video.num_tokens)
    frames = list(info.frame_indices) + list(info.frame_indices[-1:]) * (len(info.frame_indices) % 2)
    times = [(frames[i] + frames[i + 1]) / 2 / info.source_fps for i in range(0, len(frames), 2)]
    pairs = "".join(f"<{t:.1f} seconds><|vision_start|>" + "<|video_pad|>" * video.tokens_per_patch + "<|vision_end|>"
                    for t in times)
    return text.replace("<|vision_start|><|video_pad|><|vision_end|>", pairs)


@pytest.mark.parametrize("arch", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_video_data_matches_transformers(tmp_path, arch):
    """video_data through the request builder: frames sampled as for every family, paired and patched
    by the checkpoint's video processing (Qwen2.5-VL: seconds per pair from the sampled fps; Qwen3-VL:
    its video_preprocessor_config.json, a timestamp and vision start/end per pair), for a video and a
    picture with a video: prompt_tokens transformers' expanded length, greedy ids, each step's logprob
    and the prefill's top-20 within 1e-4 of transformers on the same pixels — and again from the
    processed-media cache (not decoded again) and the radix cache (cached_tokens covering the media)."""
    from transformers import AutoModelForImageTextToText

    from vlserve.preprocess import read_video
    from vlserve.preprocess.qwen_vl_video import QwenVLVideoProcessing, process_sampled_video

    path = make_tiny_qwen_vl(str(tmp_path), arch, seed=3)
    clip, picture = mp4(num_frames=8, size=64), _png(50, 80, 5)
    hf = AutoModelForImageTextToText.from_pretrained(path).eval()
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    with Engine(path, max_total_tokens=2048) as engine:
        cfg, processing, tokenizer = engine.loaded.config, engine.loaded.image_processing, engine.tokenizer
        model_type = cfg.vision_hf_config.model_type.removesuffix("_vision")
        qwen3 = model_type == "qwen3_vl"
        video_config = "video_preprocessor_config.json" if qwen3 else "preprocessor_config.json"
        with open(f"{path}/{video_config}") as f:  # Qwen2/2.5: the videos inherit the picture settings
            assert processing.video == QwenVLVideoProcessing.from_hf_config(model_type, json.load(f))
        image = processing.image.process(Image.open(io.BytesIO(picture)).convert("RGB"))
        sampled = read_video(clip, num_frames=5)
        video = process_sampled_video(processing.video, sampled)
        assert len(video.patches) == 3  # 5 frames: the last repeated to make the third pair
        for name, (prompt, with_picture) in VIDEO_PROMPTS.items():
            expanded = tokenizer(_expected_text(prompt, image, video, sampled.info, qwen3))["input_ids"]
            types = [{cfg.image_token_id: 1, cfg.video_token_id: 2}.get(t, 0) for t in expanded]
            inputs = {"input_ids": torch.tensor([expanded]), "mm_token_type_ids": torch.tensor([types]),
                      "pixel_values_videos": torch.from_numpy(video.pixel_values),
                      "video_grid_thw": torch.tensor([video.grid_thw])}
            if with_picture:
                inputs.update(pixel_values=torch.from_numpy(image.rows), image_grid_thw=torch.tensor([image.grid_thw]))
            if video.second_per_grid_t is not None:
                inputs["second_per_grid_ts"] = torch.tensor([video.second_per_grid_t])
            ref = hf_greedy(hf, inputs, STEPS)
            for attempt in range(2):
                hits = engine.builder.image_cache.hits
                req = engine.builder.build(prompt=prompt, image_data=[picture] if with_picture else None,
                                           video_data=[clip], video_num_frames=5, sampling_params=params,
                                           return_logprob=True, top_logprobs_num=20, rid=f"{name}-{attempt}")
                media = [i for i, t in enumerate(req.input_ids) if t >= cfg.text.vocab_size]  # pseudo tokens
                assert media == [i for i, t in enumerate(expanded) if types[i]]
                assert [req.input_ids[i] for i in range(len(expanded)) if not types[i]] \
                    == [t for t, kind in zip(expanded, types) if not kind]
                run_reqs(engine, [req])
                assert_matches(req, *ref)
                if attempt:  # the same bytes: processed once; the media's KV from the radix cache
                    assert engine.builder.image_cache.hits == hits + 1 + with_picture
                    assert req.cached_tokens >= max(span.end for span in req.images), req.cached_tokens


def test_router_keys_a_video_as_the_engine(tmp_path):
    """The router keys a Qwen-VL video request as its engine does: one pseudo-token span per frame
    pair (Qwen3-VL: after its timestamp's tokens), with the request's media options."""
    import base64

    from vlserve.router.keys import RouteKeys
    from vlserve.router.model_files import ModelFiles

    path = make_tiny_qwen_vl(str(tmp_path), "qwen3-vl", seed=1)
    uri = "data:video/mp4;base64," + base64.b64encode(mp4(num_frames=6, size=64)).decode()
    body = {"text": "<|vision_start|><|video_pad|><|vision_end|>What happens?", "video_data": uri,
            "media_io_kwargs": {"video": {"num_frames": 4}}}
    got = RouteKeys(ModelFiles.read(path)).key("/generate", json.dumps(body).encode())
    with Engine(path, max_total_tokens=1024) as engine:
        expected = engine.tokenize(prompt=body["text"], video_data=[uri], media_io_kwargs=body["media_io_kwargs"])
        # 4 frames → 2 pairs, each after its timestamp between its own vision start/end
        assert expected.count(engine.tokenizer.convert_tokens_to_ids("<|vision_start|>")) == 2
        ids = engine.tokenizer(body["text"])["input_ids"]  # the same as input_ids: the timestamps' tokens spliced in
        assert engine.tokenize(input_ids=ids, video_data=[uri], media_io_kwargs=body["media_io_kwargs"]) == expected
        # the chat route's `<video>` marker (a video_url part) stands where the template puts the pad
        assert engine.tokenize(prompt="<video>What happens?", video_data=[uri],
                               media_io_kwargs=body["media_io_kwargs"]) == expected
    assert got == expected


def test_a_checkpoints_video_processor_config_wins(tmp_path):
    """A Qwen2-VL checkpoint's own video_preprocessor_config.json sets its videos' processing (as
    transformers' AutoVideoProcessor reads it), the pictures keep preprocessor_config.json's."""
    from vlserve.router.model_files import ModelFiles

    path = make_tiny_qwen_vl(str(tmp_path), "qwen2-vl", seed=1)
    with open(f"{path}/preprocessor_config.json") as f:
        image_config = json.load(f)
    with open(f"{path}/video_preprocessor_config.json", "w") as f:
        json.dump({**image_config, "min_pixels": 28 * 28, "max_pixels": 28 * 28 * 4}, f)
    processing = ModelFiles.read(path).image_processing
    assert (processing.video.frames.min_pixels, processing.video.frames.max_pixels) == (28 * 28, 28 * 28 * 4)
    assert processing.image.max_pixels == image_config["max_pixels"] != 28 * 28 * 4
    # 280x280: 56x56 under the video's bound (2x2 merged tokens a pair), 224x224 under the picture's (8x8)
    assert processing.video.num_tokens(2, 280, 280) == 4 and processing.image.num_tokens(280, 280) == 64


def test_videos_with_the_same_first_8_frames_share_their_kv(tmp_path):
    """Through video_data, every frame kept (fps = the clip's): a clip of 8 frames, then that clip
    extended by 2 new frames, then another video with the same first 8 frames and 4 others. Each
    later request takes exactly the prefix and the 8 frames' 4 pairs from the radix cache
    (cached_tokens), nothing after them."""
    path = make_tiny_qwen_vl(str(tmp_path), "qwen2-vl", seed=4)
    rng = np.random.default_rng(0)
    frame = lambda: rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)  # noqa: E731
    first8 = [frame() for _ in range(8)]
    clips = [lossless_video(first8), lossless_video(first8 + [frame(), frame()]),
             lossless_video(first8 + [frame() for _ in range(4)])]
    prompt = "Look: <|vision_start|><|video_pad|><|vision_end|>What happens?"
    options = {"video": {"fps": 6}}
    with Engine(path, max_total_tokens=1024) as engine:
        reqs = []
        for clip in clips:
            req = engine.builder.build(prompt=prompt, video_data=[clip], media_io_kwargs=options,
                                       sampling_params={"max_new_tokens": 2, "temperature": 0, "ignore_eos": True})
            run_reqs(engine, [req])
            reqs.append(req)
    clip, extended, other = reqs
    assert [len(r.images) for r in reqs] == [4, 5, 6]  # frame pairs
    shared_end = clip.images[3].end  # the text before the video and the 8 frames' 4 pairs
    assert [s.content_hash for s in extended.images[:4]] == [s.content_hash for s in clip.images] \
        == [s.content_hash for s in other.images[:4]]
    assert extended.images[4].content_hash != other.images[4].content_hash
    assert (clip.cached_tokens, extended.cached_tokens, other.cached_tokens) == (0, shared_end, shared_end)
