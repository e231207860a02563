"""The native paged model matches transformers' LlavaForConditionalGeneration (docs/ARCHITECTURE.md, invariant 5)."""

import pytest
import torch

from runner_helpers import batched_logits
from vlserve.runner.model_runner import ModelRunner
from vlserve.model.loader import load_model
from vlserve.model.tiny import TinyModelSpec, make_tiny_model

from rope_shapes import ROPE_SHAPES

SHAPES = {
    "gqa-default": TinyModelSpec(),
    "mha-full": TinyModelSpec(num_kv_heads=4, vision_feature_select_strategy="full", vision_feature_layer=-1),
    "tied-headdim-rope": TinyModelSpec(tie_word_embeddings=True, head_dim=32, num_heads=2, num_kv_heads=1,
                                       rope_theta=500.0, vision_feature_layer=[-2, -1],
                                       rope_scaling={"rope_type": "linear", "factor": 2.0}),
    **ROPE_SHAPES,
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return make_tiny_model(str(path), seed=1, spec=SHAPES[request.param])


def _prompts(cfg, vocab, gen):
    """Requests with 0, 1 and 2 images at the start, middle and end, of different lengths."""
    img = cfg.image_token_id
    n = cfg.tokens_per_image

    def text(k):
        return torch.randint(5, vocab, (k,), generator=gen).tolist()

    return [
        (text(7), 0),
        ([img] * n + text(5), 1),
        (text(3) + [img] * n + text(4) + [img] * n + text(2), 2),
        (text(9) + [img] * n, 1),
    ]


def _hf_greedy(hf, ids, pixels, steps):
    """Per-request reference: logits of the prompt's last token, then of each greedy decode step."""
    out, past, logits_seq = None, None, []
    input_ids = torch.tensor([ids])
    for step in range(steps + 1):
        kwargs = {"pixel_values": pixels} if step == 0 and pixels is not None else {}
        out = hf(input_ids=input_ids, past_key_values=past, use_cache=True, **kwargs)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        logits_seq.append(logits)
        input_ids = logits.argmax().view(1, 1)
    return logits_seq


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefill_and_decode_logits_match_transformers(checkpoint, page_size):
    from transformers import LlavaForConditionalGeneration

    loaded = load_model(checkpoint)
    hf = LlavaForConditionalGeneration.from_pretrained(checkpoint).eval()
    cfg = loaded.config
    gen = torch.Generator().manual_seed(0)
    prompts = _prompts(cfg, cfg.text.vocab_size, gen)
    pixels = [torch.randn(k, 3, cfg.image_size, cfg.image_size, generator=gen) if k else None for _, k in prompts]
    steps = 32
    runner = ModelRunner.standalone(loaded, max_total_tokens=1024, page_size=page_size)
    native = batched_logits(runner, cfg, prompts, pixels, steps, lambda step, logits: [int(l.argmax()) for l in logits])

    for i, ((ids, _), px) in enumerate(zip(prompts, pixels)):
        ref = _hf_greedy(hf, ids, px, steps)
        for step, (a, b) in enumerate(zip(native[i], ref)):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), f"request {i} step {step}: max diff {(a - b).abs().max()}"
        assert [int(x.argmax()) for x in native[i]] == [int(x.argmax()) for x in ref]
