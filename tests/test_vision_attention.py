"""The vision towers' attention through the batched CPU kernel (vlserve/model/vision_attention.py):
the same hidden states as transformers' SDPA, with the kernel really called (causal=False, one
request per image), and SDPA still taking what the kernel does not (a mask)."""

import copy

import pytest
import torch
from transformers import CLIPVisionConfig, SiglipVisionConfig

from vlserve.kernels import cpu_attention
from vlserve.model import vision_attention
from vlserve.model.vision import build_vision_tower


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    real = cpu_attention.extend_attention_cpu

    def counting(*args, **kwargs):
        calls.append(kwargs.get("causal", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_attention, "extend_attention_cpu", counting)
    return calls


def towers(config, dtype):
    torch.manual_seed(0)
    ours = build_vision_tower(copy.deepcopy(config)).to(dtype).eval()
    sdpa = build_vision_tower(copy.deepcopy(config)).to(dtype).eval()
    sdpa.load_state_dict(ours.state_dict())
    sdpa.set_attn_implementation("sdpa")
    return ours, sdpa


CONFIGS = {
    "clip": CLIPVisionConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                             image_size=112, patch_size=8),  # 197 tokens an image (CLS + 14 x 14)
    "siglip": SiglipVisionConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                                 image_size=64, patch_size=8),  # head dim 48: 3 vectors
    "siglip72": SiglipVisionConfig(hidden_size=144, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                                   image_size=64, patch_size=8),  # head dim 72 (so400m's): a partial vector
}


@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tower_matches_sdpa_through_the_kernel(family, dtype, kernel_calls):
    ours, sdpa = towers(CONFIGS[family], dtype)
    assert ours.config._attn_implementation == vision_attention.NAME
    pixels = torch.randn(3, 3, CONFIGS[family].image_size, CONFIGS[family].image_size).to(dtype)
    with torch.inference_mode():
        got = ours(pixels, output_hidden_states=True).hidden_states
        want = sdpa(pixels, output_hidden_states=True).hidden_states
    assert kernel_calls == [False] * CONFIGS[family].num_hidden_layers  # every layer, bidirectional
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    for g, w in zip(got, want):
        err = ((g.double() - w.double()).norm() / w.double().norm()).item()
        assert err < tolerance, err


def test_a_mask_goes_to_sdpa(kernel_calls):
    ours, _ = towers(CONFIGS["clip"], torch.float32)
    module = next(m for m in ours.modules() if type(m).__name__ == "CLIPAttention")
    q, k, v = (torch.randn(2, 2, 10, 64) for _ in range(3))
    mask = torch.zeros(2, 1, 10, 10)
    mask[..., 7:] = float("-inf")
    out, _ = vision_attention.cpu_vision_attention(module, q, k, v, mask, scaling=0.125)
    assert kernel_calls == []
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
    assert torch.allclose(out, expected.transpose(1, 2), atol=1e-6)
