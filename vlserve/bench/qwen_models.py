"""A random-weight Qwen2.5-VL checkpoint for speed benchmarks, sized like the LLaVA one (BENCH_SPEC).

Written by `vlserve make-tiny-model --arch qwen2.5-vl --layout published`'s writer with larger shapes:
the decoder of BENCH_SPEC (hidden 1024, 8 layers, 16 heads of 64, 4 KV heads, intermediate 2816,
4000 rows), a 6-layer 256-wide windowed tower (patch 14, 2x2 merge), the published processor bounds
(min_pixels 3136, max_pixels 12845056: a 224 px picture is 16x16 patches, 64 tokens), fp32. About
105 M parameters, as the LLaVA benchmark model's 104.7 M.
"""

import dataclasses
import os

from vlserve.testing.tiny_qwen_vl import TinyQwenVLSpec

QWEN25_VL_BENCH_SPEC = TinyQwenVLSpec(
    bpe_vocab_size=3968, vocab_size=4000, hidden_size=1024, intermediate_size=2816, num_layers=8, num_heads=16,
    num_kv_heads=4, head_dim=64, mrope_section=(8, 12, 12),  # Qwen2.5-VL's 16/24/24 of 128, halved
    vision_hidden=256, vision_layers=6, vision_heads=4, min_pixels=3136, max_pixels=12845056)

# The same decoder under Qwen2.5-VL's published tower (3B to 72B share it: 32 layers of 1280 wide, 16
# heads, MLP 3420, 112-pixel windows, full attention in every 8th layer; ~670 M parameters), so that a
# picture costs the tower what it costs in the models people serve (repeat_image_ttft.py).
QWEN25_VL_TOWER_SPEC = dataclasses.replace(
    QWEN25_VL_BENCH_SPEC, vision_hidden=1280, vision_layers=32, vision_heads=16, vision_intermediate=3420,
    window_size=112, fullatt_block_indexes=(7, 15, 23, 31))


def qwen_bench_model(path: str, spec: TinyQwenVLSpec = QWEN25_VL_BENCH_SPEC, seed: int = 0) -> str:
    """Writes the checkpoint (published layout) once; later calls reuse it."""
    from vlserve.testing.tiny_qwen_vl import make_tiny_qwen_vl

    if not os.path.exists(os.path.join(path, "config.json")):
        make_tiny_qwen_vl(path, "qwen2.5-vl", seed, spec, layout="published")
    return path
