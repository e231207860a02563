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

# Real sizes (issue 52): the published shapes of LLaVA-OneVision's parts, random weights, as a
# LlavaForConditionalGeneration (which vlserve, transformers and vLLM all serve): a SigLIP-so400m tower
# (384 px, patch 14: 729 tokens per image, the last of its 26 layers, every patch kept) under a Qwen2-0.5B or
# Qwen2-1.5B decoder (151,936-row tied embeddings; the tokenizer is the tiny one, its ids a subset).
# Stored bf16 (a run in fp32 upcasts at load).
SIGLIP_SO400M = dict(vision="siglip", vision_hidden=1152, vision_intermediate=4304, vision_layers=26, vision_heads=16,
                     image_size=384, patch_size=14, vision_feature_layer=-1, vision_feature_select_strategy="full")
QWEN2_05B_SPEC = TinyModelSpec(
    text="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
    num_kv_heads=2, tie_word_embeddings=True, max_position_embeddings=32768, dtype="bfloat16", **SIGLIP_SO400M)
QWEN2_15B_SPEC = TinyModelSpec(
    text="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
    num_kv_heads=2, tie_word_embeddings=True, max_position_embeddings=32768, dtype="bfloat16", **SIGLIP_SO400M)
SPECS = {"bench": BENCH_SPEC, "small": SMALL_SPEC, "qwen2-0.5b-siglip": QWEN2_05B_SPEC,
         "qwen2-1.5b-siglip": QWEN2_15B_SPEC}


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


def stored_dtype(path: str) -> str:
    """The checkpoint's dtype as config.json records it."""
    import json

    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    return config.get("dtype") or config.get("torch_dtype") or config.get("text_config", {}).get("dtype", "?")
