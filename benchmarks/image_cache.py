"""A repeated upload with and without ProcessedImageCache: ms to turn the same bytes into a
ProcessedImage again (decode + resize + normalise + hash) against a cache hit (hash of the raw
bytes + lookup). LLaVA-1.5's 336-px processing; a small PNG and a 1080p JPEG; and a video (8 frames
sampled, decoded and processed, or the cached frames): video_qa's 64-px clip and a 480-px one of 48 frames.

    python benchmarks/image_cache.py --out benchmarks/results/image_cache.md
"""

import argparse
import io
import statistics
import time

import numpy as np
from PIL import Image

from vlserve.bench.report import write_report
from vlserve.bench.workload_defs import video_mp4
from vlserve.preprocess import ImageProcessing, ProcessedImageCache, prepare_image, prepare_video

PROCESSING = ImageProcessing(shortest_edge=336, crop_size=(336, 336))


def photo(width: int, height: int, fmt: str, seed: int = 0) -> bytes:
    """A smooth gradient with noise: compresses like a photo, not like pure noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    pixels = np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/image_cache.md")
    args = ap.parse_args()
    lines = ["| upload | bytes | prepare_image / prepare_video ms | cache hit ms | ratio |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, data in (("PNG 336x336", photo(336, 336, "PNG")), ("JPEG 1920x1080", photo(1920, 1080, "JPEG"))):
        cache = ProcessedImageCache()
        cache.prepare_image(data, PROCESSING)
        miss = median_ms(lambda: prepare_image(data, PROCESSING), args.repeats)
        hit = median_ms(lambda: cache.prepare_image(data, PROCESSING), args.repeats)
        lines.append(f"| {name} | {len(data)} | {miss:.2f} | {hit:.3f} | {miss / hit:.0f}x |")
    for name, data in (("MP4 64x64, 8 frames", video_mp4(0, frames=8, size=64)),
                       ("MP4 480x480, 8 of 48 frames", video_mp4(1, frames=48, size=480))):
        cache = ProcessedImageCache()
        cache.prepare_video(data, PROCESSING, num_frames=8)
        miss = median_ms(lambda: prepare_video(data, PROCESSING, num_frames=8), args.repeats)
        hit = median_ms(lambda: cache.prepare_video(data, PROCESSING, num_frames=8), args.repeats)
        lines.append(f"| {name} | {len(data)} | {miss:.2f} | {hit:.3f} | {miss / hit:.0f}x |")
    text = "\n".join(lines) + "\n"
    write_report(args.out, text)


if __name__ == "__main__":
    main()
