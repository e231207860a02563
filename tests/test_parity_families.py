"""LlavaForConditionalGeneration beyond LLaVA-1.5 — Mistral and Qwen2 decoders, SigLIP towers — matches
transformers (docs/ARCHITECTURE.md, invariant 5), and what is not served is refused by name.

Each text × vision shape is checked twice: the paged model alone (every logits row of prefill and
32 greedy steps within 1e-4, page size 1 and 4), and the serving path (Engine, radix cache on, real
pictures of different sizes through our preprocessing against transformers' own image processor):
identical greedy ids, log-probabilities within 1e-4, and the same outputs again from the cache.
"""

import io
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.runner_helpers import assert_runner_matches_transformers, hf_greedy_logits
from vlserve import Engine
from vlserve.core.errors import CheckpointError, InvalidRequest
from vlserve.model.families import family_for
from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

FAMILY_SHAPES = {
    # SigLIP under "default": transformers drops the first position though it is a patch (15 tokens)
    "llama-siglip": TinyModelSpec(vision="siglip"),
    # a window longer than any prompt here: the context is capped at it, and inside it the maths is full attention
    "mistral-clip": TinyModelSpec(text="mistral", sliding_window=256),
    # as llava-interleave / OneVision: SigLIP's last layer, all patches; Qwen2 with rope_theta 1e6
    "qwen2-siglip": TinyModelSpec(text="qwen2", vision="siglip", vision_feature_select_strategy="full",
                                  vision_feature_layer=-1),
    "qwen2-clip-tied": TinyModelSpec(text="qwen2", tie_word_embeddings=True),
}
STEPS = 32
TOP = 20  # top log-probabilities compared at the prefill row


@pytest.fixture(scope="module", params=sorted(FAMILY_SHAPES))
def checkpoint(request, tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp(request.param)), seed=4, spec=FAMILY_SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_paged_model_logits_match_transformers(checkpoint, page_size):
    assert_runner_matches_transformers(checkpoint, page_size, STEPS)


def _picture(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _requests(image_token: int) -> list[tuple[list[int], list[bytes]]]:
    """0, 1 and 2 pictures of different sizes and aspect ratios; one <image> token per picture."""
    gen = torch.Generator().manual_seed(1)

    def text(k):
        return torch.randint(5, 300, (k,), generator=gen).tolist()

    wide, tall, square = _picture(50, 37, 0), _picture(37, 64, 1), _picture(64, 64, 2)
    return [
        ([1] + text(7), []),
        ([1, image_token] + text(6), [wide]),
        ([1] + text(3) + [image_token] + text(4) + [image_token] + text(6), [tall, square]),
    ]


@torch.no_grad()
def _transformers_reference(checkpoint: str, requests, tokens_per_image: int, image_token: int):
    """Greedy ids and per-step log-softmax rows of transformers alone, one request at a time, its
    pixels from the image processor AutoImageProcessor loads (SiglipImageProcessorPil /
    CLIPImageProcessorPil here: transformers 5.24 without torchvision)."""
    from transformers import AutoImageProcessor, LlavaForConditionalGeneration

    hf = LlavaForConditionalGeneration.from_pretrained(checkpoint).eval()
    processor = AutoImageProcessor.from_pretrained(checkpoint)
    refs = []
    for ids, pictures in requests:
        expanded = [t for tok in ids for t in ([tok] * tokens_per_image if tok == image_token else [tok])]
        pixels = (processor([Image.open(io.BytesIO(p)) for p in pictures], return_tensors="pt")["pixel_values"]
                  if pictures else None)
        rows = [torch.log_softmax(row, -1) for row in hf_greedy_logits(hf, expanded, pixels, STEPS - 1)]
        refs.append(([int(r.argmax()) for r in rows], rows))
    return refs


@pytest.mark.parametrize("page_size", [1, 4])
def test_engine_matches_transformers_and_reuses_the_images(checkpoint, page_size):
    from transformers import AutoConfig

    image_token = AutoConfig.from_pretrained(checkpoint).image_token_id
    requests = _requests(image_token)
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    with Engine(checkpoint, max_total_tokens=1024, page_size=page_size) as engine:
        n = engine.loaded.config.tokens_per_image
        refs = _transformers_reference(checkpoint, requests, n, image_token)
        rounds = [engine.generate(input_ids=[ids for ids, _ in requests], image_data=[p for _, p in requests],
                                  return_logprob=True, top_logprobs_num=TOP, sampling_params=params)
                  for _ in range(2)]
    for i, ((ids, pictures), (ref_ids, ref_rows)) in enumerate(zip(requests, refs)):
        first, again = rounds[0][i], rounds[1][i]
        assert first["output_ids"] == ref_ids, f"request {i}"
        lps = [lp for lp, _ in first["meta_info"]["output_token_logprobs"]]
        assert max(abs(lp - float(row[t])) for lp, t, row in zip(lps, ref_ids, ref_rows)) < 1e-4, f"request {i}"
        prefill_top = first["meta_info"]["output_top_logprobs"][0]
        assert len(prefill_top) == TOP
        assert max(abs(lp - float(ref_rows[0][t])) for lp, t in prefill_top) < 1e-4, f"request {i} prefill row"
        # The same pictures again: the same outputs, their KV from the radix cache.
        assert again["output_ids"] == first["output_ids"]
        assert max(abs(a[0] - b[0]) for a, b in zip(again["meta_info"]["output_token_logprobs"],
                                                    first["meta_info"]["output_token_logprobs"])) < 1e-4
        last_image = max((j for j, t in enumerate(ids) if t == image_token), default=-1)
        image_end = last_image + 1 + (n - 1) * len(pictures)  # position after the last image's tokens
        assert again["meta_info"]["cached_tokens"] >= image_end, f"request {i}"


# ---- sliding windows: the context is capped at the window, and a longer request is refused ------

@pytest.mark.parametrize("text", ["mistral", "qwen2"])
def test_sliding_window_caps_the_context_and_says_why(tmp_path, caplog, text):
    path = make_tiny_model(str(tmp_path / text), spec=TinyModelSpec(text=text, sliding_window=48))
    with caplog.at_level(logging.WARNING), Engine(path, max_total_tokens=512, context_length=1024) as engine:
        assert engine.context_len == 48
        assert "sliding window of 48 tokens" in caplog.text
        assert engine.generate(input_ids=[1] + [7] * 30, sampling_params={"max_new_tokens": 8})["output_ids"]
        with pytest.raises(InvalidRequest, match="context length of 48 tokens .*sliding window of 48 tokens"):
            engine.generate(input_ids=[1] + [7] * 40, sampling_params={"max_new_tokens": 20})


def test_qwen2_without_sliding_window_keeps_its_context(tmp_path):
    path = make_tiny_model(str(tmp_path / "qwen2"), spec=TinyModelSpec(text="qwen2", max_position_embeddings=300))
    with Engine(path, max_total_tokens=512) as engine:
        assert engine.context_len == 300 and engine.builder.context_note == ""


# ---- refusals name what was found and what is served --------------------------------------------

def _config(arch, model_type="llava", text="llama", vision="clip_vision_model"):
    return SimpleNamespace(architectures=[arch], model_type=model_type,
                           text_config=SimpleNamespace(model_type=text),
                           vision_config=SimpleNamespace(model_type=vision))


@pytest.mark.parametrize("arch,model_type,reason", [
    ("Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe", "mixture-of-experts"),
    ("Idefics2ForConditionalGeneration", "idefics2", "perceiver resampler"),
    ("SomethingNewForCausalLM", "something", ""),
])
def test_unserved_architectures_are_refused_by_name(arch, model_type, reason):
    with pytest.raises(CheckpointError) as err:
        family_for(_config(arch, model_type))
    message = str(err.value)
    assert arch in message and reason in message
    assert "LlavaForConditionalGeneration (text: llama, mistral, qwen2; vision: clip_vision_model, " \
           "siglip_vision_model)" in message


def test_unserved_text_and_vision_models_are_refused_by_name():
    with pytest.raises(CheckpointError, match="unsupported text model 'gemma' in LlavaForConditionalGeneration; "
                                              "supported: llama, mistral, qwen2"):
        family_for(_config("LlavaForConditionalGeneration", text="gemma"))
    with pytest.raises(CheckpointError, match="unsupported vision model 'pixtral' in LlavaForConditionalGeneration; "
                                              "supported: clip_vision_model, siglip_vision_model"):
        family_for(_config("LlavaForConditionalGeneration", vision="pixtral"))
    config = _config("LlavaForConditionalGeneration", text="qwen2", vision="siglip_vision_model")
    assert family_for(config).model_type == "llava"


# ---- make-tiny-model writes what transformers would ------------------------------------------------

@pytest.mark.parametrize("text,vision", [("qwen2", "siglip"), ("mistral", "clip")])
def test_make_tiny_model_cli_writes_transformers_classes(tmp_path, text, vision):
    from transformers import AutoConfig, AutoProcessor

    from vlserve.cli import main
    from vlserve.model.loader import load_model

    path = str(tmp_path / f"{text}-{vision}")
    assert main(["make-tiny-model", path, "--arch", "llava", "--text", text, "--vision", vision]) == 0
    config = AutoConfig.from_pretrained(path)
    assert type(config).__name__ == "LlavaConfig" and config.architectures == ["LlavaForConditionalGeneration"]
    assert config.text_config.model_type == text
    assert config.vision_config.model_type == f"{vision}_vision_model"
    processor = AutoProcessor.from_pretrained(path)
    assert type(processor.image_processor).__name__ == ("SiglipImageProcessorPil" if vision == "siglip"
                                                        else "CLIPImageProcessorPil")
    assert processor.chat_template
    # The processor expands <image> to as many tokens as the model fills (tokens_per_image).
    picture = Image.open(io.BytesIO(_picture(40, 30, 3)))
    ids = processor(images=[picture], text="<image>\nHi", return_tensors="pt")["input_ids"][0].tolist()
    assert ids.count(config.image_token_id) == load_model(path).config.tokens_per_image
