"""Per model family (issue 14): tokens per image for a 640x480 and a 1920x1080 picture, and the time to
first token for a first and a repeated image, on random checkpoints with the published tower geometry.

    python benchmarks/families.py [--trials 3] [--out benchmarks/results/families.md]

Each variant's checkpoint is `make-tiny-model --arch A --text T --vision V` with the geometry of
the published towers (CLIP: 336 px in 14-px patches -> 576 features per view; SigLIP: 384 px ->
729; OneVision with its published 6x6 grids and anyres_max_9), a small random decoder and tower
width. Token counts therefore equal the published models'; times are for this small model (the
tower's depth and width, not its geometry, are what is scaled down). TTFT: wall time of a 1-token
request, preprocessing included; a first picture (new pixels) then the same bytes with another
question, alternating, median of the trials.
"""

import argparse
import io
import statistics
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np
from PIL import Image

from vlserve import Engine
from vlserve.bench.report import write_report
from vlserve.testing import tiny_anyres
from vlserve.testing.tiny import TinyModelSpec
from vlserve.testing.tiny_architectures import make_tiny_checkpoint

# (make-tiny-model --arch, --text, --vision): every LlavaForConditionalGeneration variant, then the anyres families
VARIANTS = [("llava", "llama", "clip"), ("llava", "llama", "siglip"), ("llava", "mistral", "clip"),
            ("llava", "qwen2", "siglip"), ("llava", "qwen2", "clip"), ("llava-next", "llama", "clip"),
            ("llava-onevision", "qwen2", "siglip"), ("llava-next-video", "llama", "clip")]
# The published towers' geometry: CLIP-336 (LLaVA-1.5, NeXT, NeXT-Video) and SigLIP-384 (OneVision,
# llava-interleave), both with 14-px patches; a small random decoder and tower width.
TOWER = {"clip": dict(image_size=336, patch_size=14), "siglip": dict(image_size=384, patch_size=14)}
SPEC = TinyModelSpec(max_position_embeddings=16384)
PICTURES = ((640, 480), (1920, 1080))


def picture(width: int, height: int, seed: int) -> bytes:
    """A smooth random photo-like picture as JPEG (new pixels for every seed)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 40 + 1, width // 40 + 1, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((width, height), Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def ttft(engine: Engine, image: bytes, question: str) -> float:
    start = time.perf_counter()
    engine.generate(prompt=f"USER: <image>\n{question} ASSISTANT:", image_data=image,
                    sampling_params={"max_new_tokens": 1, "temperature": 0})
    return time.perf_counter() - start


def measure(arch: str, text: str, vision: str, trials: int, threads: int) -> list[str]:
    spec = replace(SPEC, text=text, vision=vision, **TOWER[vision])
    out = tempfile.mkdtemp(prefix=f"family-{arch}-")
    if arch == "llava-onevision":  # the published 6x6 grids and anyres_max_9, not the tests' smaller ones
        path = tiny_anyres.make_tiny_llava_onevision(out, 0, spec, tiny_anyres.PUBLISHED_ONEVISION_GRID, "anyres_max_9")
    else:
        path = make_tiny_checkpoint(out, arch, seed=0, spec=spec)
    rows = []
    with Engine(path, num_threads=threads, max_total_tokens=32768) as engine:
        ttft(engine, picture(64, 48, 0), "warm up")
        for width, height in PICTURES:
            tokens = sum(t >= engine.loaded.config.text.vocab_size
                         for t in engine.tokenize(prompt="<image>", image_data=picture(width, height, 1)))
            first, repeat = [], []
            for trial in range(trials):
                image = picture(width, height, 100 * trial + width)
                first.append(ttft(engine, image, "What is in this picture?"))
                repeat.append(ttft(engine, image, "Which colour is at the top left?"))
            f, r = statistics.median(first), statistics.median(repeat)
            rows.append(f"| {arch} / {text} / {vision} | {width}x{height} | {tokens} "
                        f"| {f:.3f} | {r:.3f} | {r / f:.1%} |")
            print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/families.md")
    args = ap.parse_args(argv)
    rows = ["| family (arch / text / vision) | picture | tokens per image | first image TTFT (s, median) "
            "| repeated image TTFT (s) | repeat / first |",
            "| --- | --- | ---: | ---: | ---: | ---: |"]
    for arch, text, vision in VARIANTS:
        rows += measure(arch, text, vision, args.trials, args.threads)
    write_report(args.out,
                 f"Command: `python benchmarks/families.py --trials {args.trials}`\n\n" + "\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
