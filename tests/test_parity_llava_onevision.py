"""LLaVA-OneVision served as transformers computes it: a lone image tiled (features scaled down past
anyres_max), several images each one padded square view with a newline, a video's frames pooled
2x2 with one newline after the last; pixels, token counts, greedy ids and logprobs, cache reuse.

transformers' OneVision video processor needs torchvision, which this CPU torch cannot have; the
video's frames go to transformers' model as vlserve prepared them (the processing of one frame is
the image processor's single-view path, checked pixel for pixel below).
"""

import numpy as np
import pytest
import torch

from helpers.anyres_helpers import FRAMES, TOP, assert_matches
from helpers.anyres_helpers import hf_greedy as _hf_greedy, image as _image, png as _png, video as _video
from vlserve import Engine
from vlserve.model.loader import load_model
from vlserve.testing.tiny_anyres import VIDEO_TOKEN, make_tiny_llava_onevision
from vlserve.preprocess import MediaLimits, load_video

SIZES = [(48, 64), (100, 37), (30, 30), (480, 640), (1080, 1920), (20, 300)]  # (height, width)
STEPS = 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava_onevision(str(tmp_path_factory.mktemp("onevision")), seed=4)


@pytest.fixture(scope="module")
def hf(checkpoint):
    from transformers import (AutoTokenizer, LlavaOnevisionForConditionalGeneration,
                              LlavaOnevisionImageProcessorPil, LlavaOnevisionProcessor)

    model = LlavaOnevisionForConditionalGeneration.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    image_processor = LlavaOnevisionImageProcessorPil.from_pretrained(checkpoint)
    # Its __init__ insists on the video processor (torchvision); the image and text path needs none.
    processor = LlavaOnevisionProcessor.__new__(LlavaOnevisionProcessor)
    vc = model.config.vision_config
    processor.__dict__.update(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=None, chat_template=None,
        num_image_tokens=(vc.image_size // vc.patch_size) ** 2 + (vc.model_type == "clip_vision_model"),
        vision_feature_select_strategy=model.config.vision_feature_select_strategy,
        vision_aspect_ratio=model.config.vision_aspect_ratio, image_token="<image>", video_token=VIDEO_TOKEN,
        image_token_id=model.config.image_token_id, video_token_id=model.config.video_token_id)
    return model, processor


@pytest.mark.parametrize("size", SIZES)
def test_lone_image_pixels_identical_to_transformers(checkpoint, hf, size):
    processing = load_model(checkpoint).image_processing
    img = _image(size, 0)
    ref = hf[1].image_processor(img, return_tensors="np")
    ours = processing.for_image_count(1).process(img)
    assert np.array_equal(ours.pixel_values, ref["pixel_values"][0])
    assert ours.image_size == tuple(ref["image_sizes"][0])


def test_images_among_several_are_one_square_view_as_transformers(checkpoint, hf):
    processing = load_model(checkpoint).image_processing.for_image_count(2)
    imgs = [_image((40, 90), 1), _image((70, 20), 2)]
    ref = hf[1].image_processor([imgs], return_tensors="np")["pixel_values"]  # one sample, two images
    for img, r in zip(imgs, ref):
        assert np.array_equal(processing.process(img).pixel_values, r[0])


def test_token_counts_match_transformers(checkpoint, hf):
    """A lone image of each size (scaled down past anyres_max for the big ones), and two images."""
    _, processor = hf
    with Engine(checkpoint, max_total_tokens=8192) as engine:
        img_id = engine.loaded.config.image_token_id
        counts = set()
        for i, size in enumerate(SIZES):
            text, img = "USER: <image>\nwhat? ASSISTANT:", _image(size, i)
            ref = processor(text=text, images=[img], return_tensors="pt")["input_ids"][0].tolist()
            ids = engine.tokenize(prompt=text, image_data=[_png(img)])
            assert len(ids) == len(ref) and [t for t in ids if t < 2**62] == [t for t in ref if t != img_id]
            counts.add(len(ids))
        text = "USER: <image>\n<image>\nsame? ASSISTANT:"
        imgs = [_image((40, 90), 1), _image((70, 20), 2)]
        ref = processor(text=[text], images=[imgs], return_tensors="pt")["input_ids"][0].tolist()
        assert len(engine.tokenize(prompt=text, image_data=[_png(i) for i in imgs])) == len(ref)
    assert len(counts) >= 4


def _video_inputs(model, processor, checkpoint, prompt, video: bytes):
    """transformers' inputs for a one-video prompt, from the frames vlserve samples and prepares."""
    frames = load_model(checkpoint).image_processing.process_frames(load_video(video, MediaLimits(), FRAMES))
    side = -(-model.config.vision_config.image_size // model.config.vision_config.patch_size // 2)
    text = prompt.replace("<video>", VIDEO_TOKEN * (len(frames) * side * side + 1))
    ids = processor.tokenizer(text, return_tensors="pt")["input_ids"]
    pixels = torch.from_numpy(np.stack([f.pixel_values for f in frames]))[None]
    return {"input_ids": ids, "pixel_values_videos": pixels}


REQUESTS = [  # (prompt, image sizes, with a video)
    ("USER: say something. ASSISTANT:", [], False),
    ("USER: <image>\nWhat is in the picture? ASSISTANT:", [(1080, 1920)], False),
    ("USER: <image>\n<image>\nwhich is wider? ASSISTANT:", [(100, 37), (48, 64)], False),
    ("USER: <video>\nWhat happens? ASSISTANT:", [], True),
]


@pytest.mark.parametrize("page_size", [1, 4])
def test_engine_matches_transformers_and_reuses_media(checkpoint, hf, page_size):
    model, processor = hf
    images = [[_image(s, 10 + i) for i, s in enumerate(sizes)] for _, sizes, _ in REQUESTS]
    videos = [[_video(7)] if v else [] for *_, v in REQUESTS]
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    args = dict(prompt=[p for p, *_ in REQUESTS], image_data=[[_png(i) for i in ims] for ims in images],
                video_data=videos, sampling_params=params, return_logprob=True, top_logprobs_num=TOP,
                video_num_frames=FRAMES)
    with Engine(checkpoint, max_total_tokens=8192, page_size=page_size) as engine:
        first = engine.generate(**args)
        again = engine.generate(**args)
        engine.flush_cache()
    for (prompt, _, has_video), ims, vids, out, rep in zip(REQUESTS, images, videos, first, again):
        if has_video:
            kwargs = _video_inputs(model, processor, checkpoint, prompt, vids[0])
        else:
            inputs = processor(text=[prompt], images=[ims] if ims else None, return_tensors="pt")
            kwargs = {k: v for k, v in inputs.items() if k != "attention_mask"}
        ref = _hf_greedy(model, kwargs, STEPS)
        assert_matches(out, ref)
        assert rep["output_ids"] == ref[0]
        assert rep["meta_info"]["cached_tokens"] == (rep["meta_info"]["prompt_tokens"] - 1) // page_size * page_size


def test_a_video_shares_its_first_frames_keys_but_not_with_pictures(checkpoint):
    """Videos that agree on their first frames share those frames' keys; the same pixels as the last
    frame (which carries the video's newline), or as a still picture, key apart."""
    processing = load_model(checkpoint).image_processing
    frames = [_image((40, 48), i) for i in range(3)]
    two, three = processing.process_frames(frames[:2]), processing.process_frames(frames)
    assert two[0].content_hash == three[0].content_hash  # a shared first frame: shared keys
    assert two[1].content_hash != three[1].content_hash  # last frame vs a middle one
    picture = processing.for_image_count(2).process(frames[0])  # one untiled view, as a frame is
    assert picture.content_hash != three[0].content_hash
    with Engine(checkpoint, max_total_tokens=8192) as engine:
        cfg = engine.loaded.config
        assert [cfg.image_tokens(f) for f in three] == [4, 4, 5]  # 2x2 pooled, + the newline at the end
