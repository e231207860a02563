"""LLaVA-NeXT-Video served as transformers computes it: images as LLaVA-NeXT (anyres tiles), a
video's frames through the tower, average-pooled 2x2 before the projector, no newline.

transformers' video processor for this family needs torchvision, which this CPU torch cannot have;
the frames go to transformers' model as vlserve prepared them (the image processor's single-view
steps, which test_parity_llava_next.py checks pixel for pixel).
"""

import pytest
import torch

from helpers.anyres_helpers import FRAMES, TOP, assert_matches
from helpers.anyres_helpers import hf_greedy as _hf_greedy, image as _image, png as _png, video as _video
from vlserve import Engine
from vlserve.model.loader import load_model
from vlserve.testing.tiny_anyres import VIDEO_TOKEN, make_tiny_llava_next_video
from vlserve.preprocess import MediaLimits, load_video

STEPS = 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava_next_video(str(tmp_path_factory.mktemp("next_video")), seed=5)


@pytest.fixture(scope="module")
def hf(checkpoint):
    from transformers import AutoTokenizer, LlavaNextImageProcessorPil, LlavaNextVideoForConditionalGeneration

    model = LlavaNextVideoForConditionalGeneration.from_pretrained(checkpoint).eval()
    return model, AutoTokenizer.from_pretrained(checkpoint), LlavaNextImageProcessorPil.from_pretrained(checkpoint)


def _inputs(hf, checkpoint, prompt, images, video):
    """transformers' inputs: the prompt with its media tokens expanded, pixels of the images (its own
    processor) or of the video's frames (vlserve's)."""
    model, tokenizer, image_processor = hf
    loaded = load_model(checkpoint)
    kwargs = {}
    if images:
        px = image_processor(images, return_tensors="pt")
        kwargs.update(pixel_values=px["pixel_values"], image_sizes=px["image_sizes"])
        for img in images:
            n = loaded.config.tiled_image_tokens((img.height, img.width))
            prompt = prompt.replace("<image>", "\0" * n, 1)
        prompt = prompt.replace("\0", "<image>")
    if video is not None:
        frames = loaded.image_processing.process_frames(load_video(video, MediaLimits(), FRAMES))
        prompt = prompt.replace("<video>", VIDEO_TOKEN * sum(loaded.config.image_tokens(f) for f in frames))
        kwargs["pixel_values_videos"] = torch.stack([torch.from_numpy(f.pixel_values) for f in frames])[None]
    kwargs["input_ids"] = tokenizer(prompt, return_tensors="pt")["input_ids"]
    return kwargs


REQUESTS = [
    ("USER: say something. ASSISTANT:", [], False),
    ("USER: <image>\nWhat is in the picture? ASSISTANT:", [(480, 640)], False),
    ("USER: <image>\n<image>\nwhich is wider? ASSISTANT:", [(100, 37), (48, 64)], False),
    ("USER: <video>\nWhat happens? ASSISTANT:", [], True),
    ("USER: <image>\n<video>\nthe picture, then the video? ASSISTANT:", [(70, 20)], True),
]


@pytest.mark.parametrize("page_size", [1, 4])
def test_engine_matches_transformers_and_reuses_media(checkpoint, hf, page_size):
    images = [[_image(s, 30 + i) for i, s in enumerate(sizes)] for _, sizes, _ in REQUESTS]
    videos = [_video(8) if v else None for *_, v in REQUESTS]
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    args = dict(prompt=[p for p, *_ in REQUESTS], image_data=[[_png(i) for i in ims] for ims in images],
                video_data=[[v] if v else [] for v in videos], sampling_params=params, return_logprob=True,
                top_logprobs_num=TOP, video_num_frames=FRAMES)
    with Engine(checkpoint, max_total_tokens=8192, page_size=page_size) as engine:
        first = engine.generate(**args)
        again = engine.generate(**args)
        frame_tokens = [engine.loaded.config.image_tokens(f)
                        for f in engine.loaded.image_processing.process_frames([_image((40, 48), 0)] * 2)]
    assert frame_tokens == [4, 4]  # 4x4 features average-pooled 2x2, no newline
    for (prompt, *_), ims, vid, out, rep in zip(REQUESTS, images, videos, first, again):
        ref = _hf_greedy(hf[0], _inputs(hf, checkpoint, prompt, ims, vid), STEPS)
        assert_matches(out, ref)
        assert rep["output_ids"] == ref[0]
        assert rep["meta_info"]["cached_tokens"] == (rep["meta_info"]["prompt_tokens"] - 1) // page_size * page_size
