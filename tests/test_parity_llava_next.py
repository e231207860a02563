"""LLaVA-NeXT (anyres) served as transformers computes it: pixels, token counts, logits, greedy ids,
and the radix cache keyed on every token of a tiled image.

Images of different sizes and aspect ratios take different numbers of tokens (base view + the
tiles' features unpadded to the image's aspect ratio + a newline per row); every check below uses
images whose grids differ, so a wrong tiling, unpadding or count shows as a shape or logit error.
"""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from vlserve import Engine
from vlserve.model.loader import load_model
from vlserve.testing.tiny import TinyModelSpec
from vlserve.testing.tiny_anyres import make_tiny_llava_next
from vlserve.runner.model_runner import ModelRunner

from helpers.runner_helpers import batched_logits
from helpers.anyres_helpers import TOP, assert_matches

SIZES = [(48, 64), (100, 37), (30, 30), (480, 640), (1080, 1920), (7, 200)]  # (height, width)
STEPS = 32


def _image(size, seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava_next(str(tmp_path_factory.mktemp("next")), seed=3, spec=TinyModelSpec(num_kv_heads=2))


@pytest.fixture(scope="module")
def hf(checkpoint):
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    model = LlavaNextForConditionalGeneration.from_pretrained(checkpoint).eval()
    return model, AutoProcessor.from_pretrained(checkpoint)


@pytest.mark.parametrize("size", SIZES)
def test_pixels_identical_to_the_transformers_processor(checkpoint, hf, size):
    loaded = load_model(checkpoint)
    img = _image(size, 0)
    ref = hf[1].image_processor(img, return_tensors="np")
    ours = loaded.image_processing.process(img)
    assert ours.pixel_values.shape == ref["pixel_values"][0].shape
    assert np.array_equal(ours.pixel_values, ref["pixel_values"][0])
    assert ours.image_size == tuple(ref["image_sizes"][0])


def test_token_counts_and_ids_match_the_transformers_processor(checkpoint, hf):
    """Each image expands to exactly as many positions as LlavaNextProcessor gives it, and the text
    ids around them are the same."""
    _, processor = hf
    images = [_image(s, i) for i, s in enumerate(SIZES)]
    text = "USER: " + "".join(f"<image>\npicture {i}. " for i in range(len(images))) + "ASSISTANT:"
    ref = processor(text=text, images=images, return_tensors="pt")["input_ids"][0].tolist()
    with Engine(checkpoint, max_total_tokens=4096) as engine:
        ids = engine.tokenize(prompt=text, image_data=[_png(im) for im in images])
        counts = [engine.loaded.config.tiled_image_tokens(s) for s in SIZES]
    img_id = engine.loaded.config.image_token_id
    assert len(ids) == len(ref)
    assert [t for t in ids if t < 2**62] == [t for t in ref if t != img_id]
    assert sum(t == img_id for t in ref) == sum(counts)
    assert len(set(counts)) > 3  # the sizes really give different counts


def _hf_inputs(processor, text, images):
    return processor(text=text, images=images or None, return_tensors="pt")


@torch.no_grad()
def _hf_greedy(model, inputs, steps):
    """transformers alone, one request with its KV cache: greedy ids, their logprobs, and the full
    logits after the prompt."""
    ids, lps, past, first = [], [], None, None
    kwargs = {k: v for k, v in inputs.items() if k != "attention_mask"}
    for _ in range(steps):
        out = model(**kwargs, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        first = logits if first is None else first
        lp = torch.log_softmax(logits, -1)
        nxt = int(lp.argmax())
        ids.append(nxt)
        lps.append(float(lp[nxt]))
        kwargs = {"input_ids": torch.tensor([[nxt]])}
    return ids, lps, first


REQUESTS = [  # (prompt, image sizes): 0, 1 and 2 images of different sizes and aspect ratios
    ("USER: say something. ASSISTANT:", []),
    ("USER: <image>\nWhat is in the picture? ASSISTANT:", [(480, 640)]),
    ("USER: <image>\nand <image>\nwhich is wider? ASSISTANT:", [(100, 37), (1080, 1920)]),
    ("USER: <image>\nDescribe it. ASSISTANT:", [(30, 30)]),
]


@pytest.mark.parametrize("page_size", [1, 4])
def test_engine_matches_transformers_and_reuses_tiled_images(checkpoint, hf, page_size):
    """A batch of 0/1/2-image requests through the Engine (radix cache on): transformers' greedy
    ids for 32 steps and their logprobs within 1e-4; sent again, the same outputs with every
    image's tokens from the cache."""
    model, processor = hf
    images = [[_image(s, 10 + i) for i, s in enumerate(sizes)] for _, sizes in REQUESTS]
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    with Engine(checkpoint, max_total_tokens=4096, page_size=page_size) as engine:
        args = dict(prompt=[p for p, _ in REQUESTS], image_data=[[_png(i) for i in ims] for ims in images],
                    sampling_params=params, return_logprob=True, top_logprobs_num=TOP)
        first = engine.generate(**args)
        again = engine.generate(**args)
        engine.flush_cache()
        cfg = engine.loaded.config
    for (prompt, sizes), ims, out, rep in zip(REQUESTS, images, first, again):
        ref_ids, ref_lps, prefill_logits = _hf_greedy(model, _hf_inputs(processor, prompt, ims), STEPS)
        assert_matches(out, (ref_ids, ref_lps, torch.log_softmax(prefill_logits, -1)))
        assert rep["output_ids"] == ref_ids
        image_tokens = sum(cfg.tiled_image_tokens(s) for s in sizes)
        assert rep["meta_info"]["cached_tokens"] >= image_tokens
        # all but the last prompt token (it must be computed for its logits), in whole pages
        assert rep["meta_info"]["cached_tokens"] == (rep["meta_info"]["prompt_tokens"] - 1) // page_size * page_size


def test_prefill_logits_within_1e4_of_transformers(checkpoint, hf):
    """The paged model alone (no scheduler): the full logits after each prompt, batched, against
    transformers one request at a time."""
    model, processor = hf
    loaded = load_model(checkpoint)
    runner = ModelRunner.standalone(loaded, max_total_tokens=4096, page_size=4)
    prompts, pixels, sizes, refs = [], [], [], []
    for prompt, image_sizes in REQUESTS:
        ims = [_image(s, 20 + i) for i, s in enumerate(image_sizes)]
        inputs = _hf_inputs(processor, prompt, ims)
        processed = [loaded.image_processing.process(im) for im in ims]
        ids = inputs["input_ids"][0].tolist()
        prompts.append((ids, len(ims)))
        pixels.append([torch.from_numpy(p.pixel_values) for p in processed])
        sizes.append([p.image_size for p in processed])
        refs.append(_hf_greedy(model, inputs, 1)[2])
    native = batched_logits(runner, loaded.config, prompts, pixels, 0, None, image_sizes=sizes)
    for i, ref in enumerate(refs):
        diff = (native[i][0] - ref).abs().max()
        assert diff < 1e-4, f"request {i}: max diff {diff}"


def test_two_sizes_of_one_picture_never_share_keys(checkpoint):
    """The same picture at two sizes tiles differently: different keys from the first token on."""
    img = _image((60, 80), 5)
    with Engine(checkpoint, max_total_tokens=2048) as engine:
        a = engine.tokenize(prompt="<image>", image_data=[_png(img)])
        b = engine.tokenize(prompt="<image>", image_data=[_png(img.resize((160, 60)))])
    pa, pb = [t for t in a if t >= 2**62], [t for t in b if t >= 2**62]
    assert len(pa) != len(pb) and not set(pa) & set(pb)
