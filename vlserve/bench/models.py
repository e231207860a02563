"""Random-weight LLaVA checkpoints for speed benchmarks, where model compute must dominate."""

import os

from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

# The reference configuration of the benchmark issue (measured there against transformers and
# vLLM-CPU): Llama hidden 1024, 8 layers, 16 heads, 4 KV heads, intermediate 2816, vocab 4000;
# CLIP 224 px, patch 14 (256 image tokens). ~103 M parameters, fp32: a prefill token costs ~0.2
# GFLOP, so on two cores a forward is tens of milliseconds or more and Python overhead is small.
BENCH_SPEC = TinyModelSpec(
    vocab_size=4000, hidden_size=1024, intermediate_size=2816, num_layers=8, num_heads=16, num_kv_heads=4,
    vision_hidden=256, vision_intermediate=1024, vision_layers=6, vision_heads=4, image_size=224, patch_size=14,
    max_position_embeddings=4096)

# Small enough for quick runs; still 64 tokens per image like the built-in model.
SMALL_SPEC = TinyModelSpec(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                           image_size=64, patch_size=8, max_position_embeddings=8192)


def bench_model(path: str, spec: TinyModelSpec = BENCH_SPEC, seed: int = 0) -> str:
    """Writes the checkpoint once; later calls reuse it."""
    if not os.path.exists(os.path.join(path, "config.json")):
        make_tiny_model(path, seed=seed, spec=spec)
    return path


def num_parameters(path: str) -> int:
    from safetensors import safe_open

    total = 0
    for name in os.listdir(path):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(path, name), "pt") as f:
                total += sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
