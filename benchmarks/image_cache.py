"""A repeated upload with and without ProcessedImageCache: ms to turn the same bytes into a
ProcessedImage again (decode + resize + normalise + hash) against a cache hit (hash of the raw
bytes + lookup). LLaVA-1.5's 336-px processing; a small PNG and a 1080p JPEG.

    python benchmarks/image_cache.py --out benchmarks/results/image_cache.md
"""

import argparse
import io
import statistics
import time

import numpy as np
from PIL import Image

from vlserve.bench.report import write_report
from vlserve.preprocess import ImageProcessing, ProcessedImageCache, prepare_image

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
    lines = ["| image | bytes | prepare_image ms | cache hit ms | ratio |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, data in (("PNG 336x336", photo(336, 336, "PNG")), ("JPEG 1920x1080", photo(1920, 1080, "JPEG"))):
        cache = ProcessedImageCache()
        cache.prepare_image(data, PROCESSING)
        miss = median_ms(lambda: prepare_image(data, PROCESSING), args.repeats)
        hit = median_ms(lambda: cache.prepare_image(data, PROCESSING), args.repeats)
        lines.append(f"| {name} | {len(data)} | {miss:.2f} | {hit:.3f} | {miss / hit:.0f}x |")
    text = "\n".join(lines) + "\n"
    write_report(args.out, text)


if __name__ == "__main__":
    main()
