"""`vlserve bench llava`: the llava-bench-in-the-wild layout, answered at a chosen concurrency.

    vlserve bench llava --questions questions.jsonl --images DIR --answers answers.jsonl \
        [--url URL | --model DIR] [--concurrency N]
    vlserve bench llava --answers answers.jsonl      # a synthetic set for the built-in model, with accuracy

questions.jsonl: {"question_id", "image" (file name under --images), "text", "category"}, optionally
"answer" (a reference: accuracy is reported; for the synthetic set category is the question type).
answers.jsonl, LLaVA's format: {"question_id", "prompt", "text", "answer_id", "model_id", "metadata"}
in question order; metadata carries this harness's timings and token counts.

Each question is one request; --concurrency of them are in flight at a time (each streams, for its
time to first token). Reported: requests/s and output tokens/s, time to first token and latency at
p50/p90/p99, the cache hit rate (Σ cached / Σ prompt tokens) and accuracy where references exist.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from vlserve.bench.client import Answer, Job, make_client
from vlserve.bench.jsonl import iter_jsonl


@dataclass
class LlavaQuestion:
    question_id: int | str
    image: str
    text: str
    category: str | None = None
    answer: str | None = None


def image_prompt(text: str) -> str:
    return f"USER: <image>\n{text} ASSISTANT:"


def read_questions(path: str, images_dir: str) -> list[LlavaQuestion]:
    out = []
    for where, q in iter_jsonl(path):
        missing = [k for k in ("question_id", "image", "text") if k not in q]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        if not os.path.isfile(os.path.join(images_dir, q["image"])):
            raise ValueError(f"{where}: image {q['image']!r} not found in {images_dir}")
        out.append(LlavaQuestion(q["question_id"], q["image"], q["text"], q.get("category"), q.get("answer")))
    if not out:
        raise ValueError(f"{path}: no questions")
    return out


def answer_line(q: LlavaQuestion, a: Answer, model_id: str) -> dict:
    return {"question_id": q.question_id, "prompt": q.text, "text": a.text.strip(),
            "answer_id": uuid.uuid4().hex[:22], "model_id": model_id,
            "metadata": {"latency_s": round(a.latency_s, 4), "ttft_s": None if a.ttft_s is None else round(a.ttft_s, 4),
                         "prompt_tokens": a.prompt_tokens, "cached_tokens": a.cached_tokens,
                         "completion_tokens": a.completion_tokens, "finish_reason": a.finish_reason}}


def percentiles(values: list[float], points=(50, 90, 99)) -> dict[str, float]:
    """Nearest-rank percentiles; empty when there are no values."""
    if not values:
        return {}
    s = sorted(values)
    return {f"p{p}": round(s[min(len(s) - 1, max(0, -(-p * len(s) // 100) - 1))], 4) for p in points}


def run(questions: list[LlavaQuestion], images_dir: str, client, concurrency: int = 8,
        max_new_tokens: int = 32) -> tuple[list[Answer], float]:
    images: dict[str, bytes] = {}
    for q in questions:
        if q.image not in images:
            with open(os.path.join(images_dir, q.image), "rb") as f:
                images[q.image] = f.read()

    def ask(q: LlavaQuestion) -> Answer:
        [a] = client.generate([Job(image_prompt(q.text), images=[images[q.image]], max_new_tokens=max_new_tokens)])
        return a

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        answers = list(pool.map(ask, questions))
    return answers, time.monotonic() - start


def report(questions: list[LlavaQuestion], answers: list[Answer], wall_s: float, concurrency: int) -> dict:
    prompt = sum(a.prompt_tokens for a in answers)
    out = {"questions": len(answers), "concurrency": concurrency, "wall_s": round(wall_s, 3),
           "requests_per_s": round(len(answers) / wall_s, 3),
           "output_tokens_per_s": round(sum(a.completion_tokens for a in answers) / wall_s, 2),
           "ttft_s": percentiles([a.ttft_s for a in answers if a.ttft_s is not None]),
           "latency_s": percentiles([a.latency_s for a in answers]),
           "cache_hit_rate": round(sum(a.cached_tokens for a in answers) / prompt, 4) if prompt else 0.0,
           "errors": sum(a.error is not None for a in answers)}
    graded = [(q, a) for q, a in zip(questions, answers) if q.answer is not None]
    if graded:
        from vlserve.builtin.answers import is_correct

        right = [is_correct(q.category or "", a.text, q.answer) for q, a in graded]  # captions: shape/colour pairs
        out["accuracy"] = round(sum(right) / len(right), 4)
        by_cat: dict[str, list[bool]] = {}
        for (q, _), r in zip(graded, right):
            by_cat.setdefault(q.category or "all", []).append(r)
        out["accuracy_by_category"] = {c: round(sum(v) / len(v), 4) for c, v in sorted(by_cat.items())}
    return out


def write_answers(path: str, questions: list[LlavaQuestion], answers: list[Answer], model_id: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for q, a in zip(questions, answers):
            f.write(json.dumps(answer_line(q, a, model_id), ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--questions", help="questions.jsonl (omit for the synthetic set of the built-in model)")
    p.add_argument("--images", help="folder holding the questions' images")
    p.add_argument("--answers", required=True, help="answers.jsonl to write (LLaVA's format)")
    p.add_argument("--url", help="a running `vlserve serve` (default: an in-process Engine)")
    p.add_argument("--api-key")
    p.add_argument("--model", help="checkpoint for the in-process Engine (default: the built-in model)")
    p.add_argument("--model-id", help="model_id written in answers.jsonl (default: the model's folder name)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--num-threads", type=int, help="torch CPU threads for the in-process Engine")
    p.add_argument("--synthetic-images", type=int, default=8)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--report-json", help="also write the report here")


def main(args: argparse.Namespace) -> int:
    questions_path, images_dir = args.questions, args.images
    if questions_path is None:
        from vlserve.bench.workload_defs import write_llava_bench_set

        folder = os.path.splitext(os.path.abspath(args.answers))[0] + ".synthetic"
        questions_path, images_dir = write_llava_bench_set(folder, images=args.synthetic_images, seed=args.seed)
        print(f"synthetic set: {questions_path}", file=sys.stderr)
    if images_dir is None:
        print("error: --images is required with --questions", file=sys.stderr)
        return 2
    try:
        questions = read_questions(questions_path, images_dir)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.concurrency < 1:
        print(f"error: --concurrency must be >= 1, got {args.concurrency}", file=sys.stderr)
        return 2
    model_id = args.model_id or os.path.basename(os.path.normpath(args.model or args.url or "vlserve-builtin"))
    client = make_client(args.url, args.model, args.api_key,
                         **({"num_threads": args.num_threads} if args.num_threads else {}))
    try:
        answers, wall = run(questions, images_dir, client, args.concurrency, args.max_new_tokens)
    finally:
        client.close()
    write_answers(args.answers, questions, answers, model_id)
    result = report(questions, answers, wall, args.concurrency)
    print(json.dumps(result, indent=2))
    if args.report_json:
        with open(args.report_json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
