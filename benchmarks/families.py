"""Per served family (issue 14): tokens per image for a 640x480 and a 1920x1080 picture, and the time
to first token for a first and a repeated picture, on random checkpoints from make-tiny-model.

    python benchmarks/families.py [--trials 5] [--out benchmarks/results/families.md]

VARIANTS lists (arch, text, vision) as `vlserve make-tiny-model --arch --text --vision` takes them;
every checkpoint has the same small shape (Spec below), so rows differ by family, not by size. TTFT
is the wall time of a 1-token request, preprocessing included: "first" a picture never seen before,
"repeat" the same bytes with another question (raw-bytes cache, vision tower and image prefill
skipped through the radix cache).
"""

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from image_cache import photo  # noqa: E402  (the same synthetic photos as benchmarks/image_cache.py)

from vlserve import Engine  # noqa: E402
from vlserve.bench.report import write_report  # noqa: E402
from vlserve.model.tiny import TinyModelSpec, make_tiny_model  # noqa: E402

VARIANTS = [("llava", "llama", "clip"), ("llava", "llama", "siglip"), ("llava", "mistral", "clip"),
            ("llava", "qwen2", "siglip"), ("llava", "qwen2", "clip")]
SPEC = TinyModelSpec(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                     image_size=64, patch_size=8, max_position_embeddings=4096)
SIZES = ((640, 480), (1920, 1080))


def ttft(engine: Engine, image: bytes, question: str) -> float:
    start = time.perf_counter()
    engine.generate(prompt=f"USER: <image>\n{question} ASSISTANT:", image_data=image,
                    sampling_params={"max_new_tokens": 1, "temperature": 0})
    return time.perf_counter() - start


def image_tokens(engine: Engine, image: bytes) -> int:
    return len(engine.tokenize(prompt="<image>", image_data=image)) - len(engine.tokenize(prompt=""))


def measure(path: str, label: str, trials: int, threads: int) -> str:
    with Engine(path, num_threads=threads) as engine:
        ttft(engine, photo(64, 64, "PNG"), "warm up")
        tokens = [image_tokens(engine, photo(w, h, "JPEG", seed=w)) for w, h in SIZES]
        first, repeat = [], []
        for trial in range(trials):
            image = photo(640, 480, "JPEG", seed=1000 + trial)
            first.append(ttft(engine, image, "What is in this picture?"))
            repeat.append(ttft(engine, image, "Which colour is at the top left?"))
    f, r = statistics.median(first) * 1000, statistics.median(repeat) * 1000
    return f"| {label} | {tokens[0]} | {tokens[1]} | {f:.1f} | {r:.1f} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/families.md")
    args = ap.parse_args(argv)
    rows = ["| family (arch / text / vision) | tokens, 640x480 | tokens, 1920x1080 | TTFT first (ms, median) "
            "| TTFT repeat (ms, median) |", "| --- | ---: | ---: | ---: | ---: |"]
    for arch, text, vision in VARIANTS:
        with tempfile.TemporaryDirectory(prefix="vlserve-family-") as tmp:
            path = make_tiny_model(tmp, spec=replace(SPEC, text=text, vision=vision), arch=arch)
            rows.append(measure(path, f"{arch} / {text} / {vision}", args.trials, args.threads))
            print(rows[-1], flush=True)
    write_report(args.out, f"Command: `python benchmarks/families.py --trials {args.trials}`; random checkpoints "
                           f"of one small shape (hidden 128, 2 layers, 64-px tower with 8-px patches)."
                           "\n\n" + "\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
