"""The vision tower on one video's frames (or a few images), its attention through our CPU kernel
(vlserve/model/vision_attention.py, the default) against transformers' SDPA on the same tower:
ms per batch, best of --repeats, alternating the two.

    python benchmarks/vision_tower.py --dtype bfloat16 --out benchmarks/results/vision_tower.md
"""

import argparse

import torch

from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.bench.own_thread import on_own_thread
from vlserve.bench.report import write_report
from vlserve.bench.timing import best_ms
from vlserve.model import vision_attention
from vlserve.model.loader import load_model


def measure(args) -> str:
    loaded = load_model(args.model or bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC), dtype=args.dtype)
    vision = loaded.model.vision
    size = loaded.config.image_size
    lines = [f"Vision tower of `{args.model or 'BENCH_SPEC'}` ({args.dtype}, {torch.get_num_threads()} threads): "
             "ms per batch of images, best of "
             f"{args.repeats} (the two attentions alternating).", "",
             "| images | SDPA ms | our kernel ms | speed-up |", "| ---: | ---: | ---: | ---: |"]
    for count in args.images:
        pixels = torch.randn(count, 3, size, size)
        times = {}
        with torch.inference_mode():
            for _ in range(2):  # alternate: SDPA, ours, SDPA, ours
                for name in ("sdpa", vision_attention.NAME):
                    vision.vision_tower.set_attn_implementation(name)
                    ms = best_ms(lambda: vision(pixels), args.repeats)
                    times[name] = min(times.get(name, float("inf")), ms)
        vision.vision_tower.set_attn_implementation(vision_attention.NAME)
        sdpa, ours = times["sdpa"], times[vision_attention.NAME]
        lines.append(f"| {count} | {sdpa:.1f} | {ours:.1f} | {sdpa / ours:.2f}x |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a checkpoint (default: the benchmarks' BENCH_SPEC model)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--images", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/vision_tower.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # on a thread of its own, as the engine runs its model (own_thread.py: one OpenMP team)
    write_report(args.out, on_own_thread(lambda: measure(args), "vision-tower"))


if __name__ == "__main__":
    main()
