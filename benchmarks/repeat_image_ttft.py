"""Time to first token for a follow-up question about the same upload, against the first question
about a new one (issue 15): the repeat skips decode/resize/hash (the raw-bytes cache), the vision
tower and the image's prefill (the radix cache), so only the new question's tokens are computed.

    python benchmarks/repeat_image_ttft.py [--spec bench] [--trials 5] [--out benchmarks/results/repeat_image_ttft.md]

Each trial: a picture never seen before (new pixels) with question A, then question B as the next
turn of the same conversation (the first turn, its answer, the new question) with the same bytes
re-sent; TTFT is the wall time of a 1-token request, preprocessing included, so the answer is the
first request's one token. The two request kinds alternate within one run, on the 104.7 M benchmark
model (224 px, 256 image tokens). A third request repeats the follow-up exactly: only its last
prompt token is computed, so its time is the floor any follow-up pays (one batch-1 pass over the
weights). `--spec qwen2.5-vl`: the 104.7 M
Qwen2.5-VL checkpoint (bench/qwen_models.py) with the same prompts in Qwen's chat markup; its
pictures keep their native resolution (336 px: 144 tokens; 1920x1080: 1932x1092, 2,691 tokens).
`--spec qwen2.5-vl-tower`: the same decoder under Qwen2.5-VL's published tower (32 layers of 1280,
~670 M parameters), so a first question pays the tower the models people serve make it pay.
"""

import argparse
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from image_cache import photo  # noqa: E402  (the same synthetic photos as benchmarks/image_cache.py)

from vlserve import Engine  # noqa: E402
from vlserve.bench.models import BENCH_SPEC, SMALL_SPEC, bench_model  # noqa: E402
from vlserve.bench.qwen_models import QWEN25_VL_TOWER_SPEC, qwen_bench_model  # noqa: E402
from vlserve.bench.qwen_workloads import FAMILY as QWEN, qwen_prompt  # noqa: E402
from vlserve.bench.report import write_report  # noqa: E402

QWEN_TOWER = f"{QWEN}-tower"

FORMATS = (("PNG 336x336", 336, 336, "PNG"), ("JPEG 1920x1080", 1920, 1080, "JPEG"))


FIRST, FOLLOW_UP = "What is in this picture?", "Which colour is at the top left?"


def ttft(engine: Engine, image: bytes, prompt: str) -> tuple[float, dict]:
    """(seconds to the first token, the result) of a 1-token request."""
    start = time.perf_counter()
    out = engine.generate(prompt=prompt, image_data=image, sampling_params={"max_new_tokens": 1, "temperature": 0})
    return time.perf_counter() - start, out


def computed(out: dict) -> int:
    """The prompt tokens this request computed (not found in the radix cache)."""
    return out["meta_info"]["prompt_tokens"] - out["meta_info"]["cached_tokens"]


def conversation(markup, answer: str | None = None) -> str:
    """The first turn (answer None), or the first turn, its answer and the follow-up question."""
    first = f"USER: <image>\n{FIRST} ASSISTANT:"
    return markup(first if answer is None else f"{first} {answer}</s>USER: {FOLLOW_UP} ASSISTANT:")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", choices=("small", "bench", QWEN, QWEN_TOWER), default="bench",
                    help=f"{QWEN}: bench/qwen_models.py's checkpoint, the prompts in Qwen's chat markup; "
                         f"{QWEN_TOWER}: the same with Qwen2.5-VL's published tower")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/repeat_image_ttft.md")
    args = ap.parse_args(argv)
    if args.spec == QWEN:
        model, markup = qwen_bench_model(f"/tmp/vlserve-bench-models/{QWEN}-bench"), qwen_prompt
    elif args.spec == QWEN_TOWER:
        model, markup = qwen_bench_model(f"/tmp/vlserve-bench-models/{QWEN_TOWER}", QWEN25_VL_TOWER_SPEC), qwen_prompt
    else:
        spec = BENCH_SPEC if args.spec == "bench" else SMALL_SPEC
        model, markup = bench_model(f"/tmp/vlserve-bench-models/{args.spec}", spec), str
    rows = ["| image | first question TTFT (s, median) | follow-up TTFT (s, median) | follow-up / first "
            "| same follow-up again (s) | tokens computed: first / follow-up |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    with Engine(model, num_threads=args.threads) as engine:
        ttft(engine, photo(64, 64, "PNG"), markup("USER: <image>\nwarm up ASSISTANT:"))
        for name, width, height, fmt in FORMATS:
            first, repeat, again = [], [], []
            for trial in range(args.trials):
                image = photo(width, height, fmt, seed=1000 * trial + width)
                seconds, out = ttft(engine, image, conversation(markup))
                first.append(seconds)
                seconds, follow_up = ttft(engine, image, conversation(markup, out["text"]))
                repeat.append(seconds)
                # only the last prompt token is computed: one batch-1 pass over the weights, the floor
                again.append(ttft(engine, image, conversation(markup, out["text"]))[0])
            f, r, a = statistics.median(first), statistics.median(repeat), statistics.median(again)
            tokens = f"{computed(out)} / {computed(follow_up)}"
            rows.append(f"| {name} | {f:.3f} | {r:.3f} | {r / f:.1%} | {a:.3f} | {tokens} |")
            print(rows[-1], flush=True)
    command = f"python benchmarks/repeat_image_ttft.py --spec {args.spec} --trials {args.trials} --out {args.out}"
    write_report(args.out, f"Command: `{command}`\n\n" + "\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
