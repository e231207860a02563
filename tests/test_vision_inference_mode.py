"""Every family's vision part runs without autograd: a tower run with the graph on keeps each layer's
activations for a backward pass that never comes (a 1080p picture through Qwen2.5-VL's published tower
took 23.5 GB that way)."""

import pytest
import torch

from vlserve.model.loader import load_model
from vlserve.testing.tiny import make_tiny_model
from vlserve.testing.tiny_qwen_vl import QWEN_ARCHS, make_tiny_qwen_vl


def qwen_pixels(arch: str) -> torch.Tensor:
    """One picture of 4 x 4 patches as the Qwen processors give it: [t, h, w, 3 * 2 * patch²]."""
    patch = QWEN_ARCHS[arch].patch_size
    return torch.randn(1, 4, 4, 3 * 2 * patch * patch)


@pytest.mark.parametrize("arch", sorted(QWEN_ARCHS))
def test_qwen_towers_return_embeddings_without_a_graph(tmp_path, arch):
    model = load_model(make_tiny_qwen_vl(str(tmp_path), arch)).model
    assert any(p.requires_grad for p in model.parameters())  # the graph would be built without inference mode
    (embeds,) = model.encode_images([qwen_pixels(arch)], [(56, 56)])
    assert embeds.grad_fn is None and not embeds.requires_grad and embeds.is_inference()


def test_llava_tower_returns_embeddings_without_a_graph(tmp_path):
    loaded = load_model(make_tiny_model(str(tmp_path)))
    size = loaded.config.vision_hf_config.image_size
    (embeds,) = loaded.model.encode_images([torch.randn(3, size, size)], [(size, size)])
    assert embeds.grad_fn is None and not embeds.requires_grad and embeds.is_inference()
