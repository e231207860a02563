"""bf16: the native model in bf16 (bf16 weights and KV, the CPU GEMM path of cpu/gemm.py) against
transformers' LlavaForConditionalGeneration in bf16, and the dtype `--dtype auto` picks.

Two bf16 implementations round differently, so exact agreement is not expected. What is checked:
at every position of transformers' own greedy continuation (teacher forcing, so one early
disagreement does not decide the rest), the native argmax agrees at least 90% of the time and the
logits differ by no more than bf16 rounding explains: at most 3x transformers-bf16's own distance
from fp32, plus one bf16 ulp of the largest logit.
"""

import pytest
import torch

from helpers.runner_helpers import batched_logits
from vlserve.runner.model_runner import ModelRunner
from vlserve.cpu import gemm as cpu_gemm
from vlserve.model.loader import load_model, resolve_dtype
from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

STEPS = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    spec = TinyModelSpec(hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, num_layers=2)
    return make_tiny_model(str(tmp_path_factory.mktemp("bf16")), seed=3, spec=spec)


def _prompts(cfg, gen):
    img, n = cfg.image_token_id, cfg.tokens_per_image

    def text(k):
        return torch.randint(5, cfg.text.vocab_size, (k,), generator=gen).tolist()

    return [(text(20), 0), ([img] * n + text(6), 1), (text(4) + [img] * n + text(30), 1), (text(9), 0)]


def _hf_logits(hf, ids, pixels):
    """Logits at every position of ids, one forward."""
    kwargs = {"pixel_values": pixels} if pixels is not None else {}
    return hf(input_ids=torch.tensor([ids]), **kwargs).logits[0].float()


def _hf_greedy_tokens(hf, ids, pixels, steps):
    seq = list(ids)
    for _ in range(steps):
        seq.append(int(_hf_logits(hf, seq, pixels)[-1].argmax()))
    return seq[len(ids):]


def _native_logits(loaded, prompts, pixels, continuations):
    """Prefill each prompt, then decode the given continuation one token per step, all requests in
    one batch; returns per request the logits after the prompt and after each forced token."""
    cfg = loaded.config
    runner = ModelRunner.standalone(loaded, max_total_tokens=2048, context_length=512)
    return batched_logits(runner, cfg, prompts, pixels, STEPS, lambda step, _: [c[step] for c in continuations])

def test_bf16_matches_transformers_bf16(checkpoint):
    from transformers import LlavaForConditionalGeneration

    loaded = load_model(checkpoint, dtype="bfloat16")
    assert loaded.model.lm_head.weight.dtype == torch.bfloat16
    assert isinstance(loaded.model.lm_head, cpu_gemm.CpuLinear)
    hf16 = LlavaForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    hf32 = LlavaForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    cfg = loaded.config
    gen = torch.Generator().manual_seed(0)
    prompts = _prompts(cfg, gen)
    pixels = [torch.randn(k, 3, cfg.image_size, cfg.image_size, generator=gen) if k else None for _, k in prompts]
    with torch.inference_mode():
        continuations = [_hf_greedy_tokens(hf16, ids, px, STEPS) for (ids, _), px in zip(prompts, pixels)]
        native = _native_logits(loaded, prompts, pixels, continuations)
        agree = total = 0
        for i, ((ids, _), px) in enumerate(zip(prompts, pixels)):
            full = ids + continuations[i]
            ref16 = _hf_logits(hf16, full, px.bfloat16() if px is not None else None)[len(ids) - 1:]
            ref32 = _hf_logits(hf32, full, px)[len(ids) - 1:]
            mine = torch.stack(native[i])
            hf_err = (ref16 - ref32).abs().max().item()
            ulp = ref16.abs().max().item() * 2 ** -8
            err = (mine - ref16).abs().max().item()
            assert err <= 3 * hf_err + ulp, (f"request {i}: max |native - hf bf16| {err:.4f}, "
                                             f"hf bf16 vs fp32 {hf_err:.4f}")
            agree += int((mine.argmax(-1) == ref16.argmax(-1)).sum())
            total += mine.shape[0]
    assert agree / total >= 0.9, f"greedy agreement {agree}/{total}"


def test_auto_dtype_follows_the_checkpoint_and_the_cpu(monkeypatch):
    assert resolve_dtype("auto", torch.float32)[0] == torch.float32
    assert resolve_dtype(None, torch.bfloat16)[0] == torch.bfloat16
    assert resolve_dtype("float32", torch.bfloat16)[0] == torch.float32
    assert resolve_dtype("bfloat16", torch.float32)[0] == torch.bfloat16
    monkeypatch.setattr("vlserve.model.loader.native_bf16", lambda: True)
    dtype, note = resolve_dtype("auto", torch.bfloat16)
    assert dtype == torch.bfloat16 and "native" in note
    monkeypatch.setattr("vlserve.model.loader.native_bf16", lambda: False)
    dtype, note = resolve_dtype("auto", torch.bfloat16)
    assert dtype == torch.float32 and "no native bfloat16" in note
    assert resolve_dtype("auto", torch.bfloat16, device="cuda")[0] == torch.bfloat16


def test_auto_runs_an_fp16_checkpoint_in_bf16_where_the_cpu_has_native_bf16(monkeypatch):
    monkeypatch.setattr("vlserve.model.loader.native_bf16", lambda: True)
    monkeypatch.setattr("vlserve.model.loader.native_fp16", lambda: True)  # AVX512_FP16 too: bf16 still wins
    dtype, note = resolve_dtype("auto", torch.float16)
    assert dtype == torch.bfloat16 and "float16" in note and "--dtype float16" in note
    assert resolve_dtype("float16", torch.float16)[0] == torch.float16  # asked for: kept
    assert resolve_dtype(None, torch.float16)[0] == torch.float16
    assert resolve_dtype("auto", torch.float16, device="cuda")[0] == torch.float16
    monkeypatch.setattr("vlserve.model.loader.native_bf16", lambda: False)
    assert resolve_dtype("auto", torch.float16)[0] == torch.float16  # native fp16 only: the checkpoint's
    monkeypatch.setattr("vlserve.model.loader.native_fp16", lambda: False)
    assert resolve_dtype("auto", torch.float16)[0] == torch.float32  # neither: fp32
