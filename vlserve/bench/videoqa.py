"""`vlserve videoqa`: answer questions about videos from a JSONL file, resumably.

    vlserve videoqa --input items.jsonl --output answers.jsonl [--url URL] [--model DIR]
    vlserve videoqa --output answers.jsonl            # synthetic scene videos for the built-in model

Input: one item a line, {"id", "video" (path; relative paths are taken from the input file's folder),
"question" or "questions"}; optional "answer"/"answers" (references: accuracy is reported) and
"qtype"/"qtypes". Output: one line per question, {"id", "question", "answer", ...timing and cache
fields}; an item with several questions gives ids ID/0, ID/1, ….

Resumable: each answer line is written whole, flushed and fsynced before the next, so after a crash
(even kill -9) the file holds complete lines plus at most one torn last line, which the rerun cuts off
before skipping every id already answered. No id is lost or written twice.

Sharing: the questions on one video are sent together, so the scheduler computes the video's KV once
(the first question's prefill puts it in the radix tree; the others are deferred a round and hit it).
Several videos are in flight at once (--parallel-videos) to keep the batch full.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from vlserve.bench.client import Answer, Job, make_client
from vlserve.bench.jsonl import iter_jsonl


@dataclass
class Question:
    qid: str
    question: str
    reference: str | None = None
    qtype: str | None = None


@dataclass
class VideoItems:
    """Every pending question on one video file (items naming the same file are merged)."""
    video: str
    questions: list[Question] = field(default_factory=list)


def video_prompt(question: str) -> str:
    """LLaVA-1.5 style, as the built-in model was trained: the frames, a newline, the question."""
    return f"USER: <video>\n{question} ASSISTANT:"


# ---------------------------------------------------------------- input


def read_items(path: str) -> list[tuple[str, list[Question]]]:
    """(video path, questions) per item, in file order. Raises ValueError naming the bad line."""
    base = os.path.dirname(os.path.abspath(path))
    items, seen = [], set()
    for where, item in iter_jsonl(path):
        items.append(_parse_item(item, where, base, seen))
    return items


def _parse_item(item, where: str, base: str, seen: set) -> tuple[str, list[Question]]:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: an item must be a JSON object")
    for key in ("id", "video"):
        if not isinstance(item.get(key), (str, int)) or item.get(key) == "":
            raise ValueError(f"{where}: missing or empty {key!r}")
    item_id = str(item["id"])
    if item_id in seen:
        raise ValueError(f"{where}: duplicate id {item_id!r}")
    seen.add(item_id)
    single = "question" in item
    if single == ("questions" in item):
        raise ValueError(f"{where}: give exactly one of 'question' or 'questions'")
    texts = [item["question"]] if single else item["questions"]
    if not isinstance(texts, list) or not texts or not all(isinstance(q, str) and q.strip() for q in texts):
        raise ValueError(f"{where}: questions must be non-empty strings")
    refs = _per_question(item, "answer", "answers", single, len(texts), where)
    qtypes = _per_question(item, "qtype", "qtypes", single, len(texts), where)
    qids = [item_id] if single else [f"{item_id}/{i}" for i in range(len(texts))]
    video = os.path.join(base, str(item["video"]))
    return video, [Question(q, t, r, k) for q, t, r, k in zip(qids, texts, refs, qtypes)]


def _per_question(item: dict, one: str, many: str, single: bool, n: int, where: str) -> list:
    values = [item.get(one)] if single else item.get(many)
    if values is None:
        return [None] * n
    if not isinstance(values, list) or len(values) != n:
        raise ValueError(f"{where}: {many!r} must be a list with one entry per question")
    return values


def group_by_video(items: list[tuple[str, list[Question]]], done: set[str]) -> list[VideoItems]:
    groups: dict[str, VideoItems] = {}
    for video, questions in items:
        pending = [q for q in questions if q.qid not in done]
        if pending:
            groups.setdefault(video, VideoItems(video)).questions.extend(pending)
    return list(groups.values())


# ---------------------------------------------------------------- output


class AnswerLog:
    """The append-only output file: whole lines, each made durable before the next is written."""

    def __init__(self, path: str):
        self.path = path
        self.done: set[str] = set()
        self.lock = threading.Lock()
        self._repair_and_load()
        self.file = open(path, "a")

    def _repair_and_load(self) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            end = data.rfind(b"\n") + 1
            if end < len(data):  # a torn last line from a crash: cut it off, it is answered again
                f.truncate(end)
        for line in data[:end].splitlines():
            if line.strip():
                self.done.add(json.loads(line)["id"])

    def write(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self.lock:
            if record["id"] in self.done:
                return
            self.file.write(line)
            self.file.flush()
            os.fsync(self.file.fileno())
            self.done.add(record["id"])

    def close(self) -> None:
        self.file.close()


def answer_record(q: Question, video: str, a: Answer) -> dict:
    record = {"id": q.qid, "question": q.question, "answer": a.text.strip(), "video": video,
              "latency_s": round(a.latency_s, 4), "ttft_s": None if a.ttft_s is None else round(a.ttft_s, 4),
              "prompt_tokens": a.prompt_tokens, "cached_tokens": a.cached_tokens,
              "completion_tokens": a.completion_tokens, "finish_reason": a.finish_reason}
    if q.reference is not None:
        record["reference"] = q.reference
        record["correct"] = _is_correct(q, a.text)
    if q.qtype is not None:
        record["qtype"] = q.qtype
    return record


def _is_correct(q: Question, text: str) -> bool:
    from vlserve.builtin.answers import is_correct, normalise

    if q.qtype:
        return is_correct(q.qtype, text, q.reference)
    return normalise(text) == normalise(q.reference)


# ---------------------------------------------------------------- the run


@dataclass
class Summary:
    videos: int = 0
    questions: int = 0
    skipped: int = 0
    wall_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    correct: int = 0
    graded: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, record: dict) -> None:
        self.questions += 1
        self.prompt_tokens += record["prompt_tokens"]
        self.cached_tokens += record["cached_tokens"]
        if "correct" in record:
            self.graded += 1
            self.correct += record["correct"]

    def as_dict(self) -> dict:
        wall = max(self.wall_s, 1e-9)
        out = {"videos": self.videos, "questions": self.questions, "skipped_already_answered": self.skipped,
               "wall_s": round(self.wall_s, 3), "videos_per_s": round(self.videos / wall, 3),
               "questions_per_s": round(self.questions / wall, 3),
               "cache_hit_rate": round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0}
        if self.graded:
            out["accuracy"] = round(self.correct / self.graded, 4)
            out["graded"] = self.graded
        if self.errors:
            out["errors"] = self.errors
        return out


def run(items_path: str, output: str, client, parallel_videos: int = 4, max_new_tokens: int = 32,
        progress: bool = True) -> Summary:
    items = read_items(items_path)
    log = AnswerLog(output)
    total = sum(len(qs) for _, qs in items)
    groups = group_by_video(items, log.done)
    summary = Summary(skipped=total - sum(len(g.questions) for g in groups))
    bar = _progress(total, summary.skipped, progress)
    start = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=max(1, parallel_videos)) as pool:
            futures = {pool.submit(_answer_video, client, g, max_new_tokens): g for g in groups}
            for future in as_completed(futures):
                group = futures[future]
                try:
                    answers = future.result()
                except Exception as e:  # one bad video must not stop the job; its ids stay pending
                    summary.errors.append(f"{group.video}: {e}")
                    bar.update(len(group.questions))
                    continue
                for q, a in zip(group.questions, answers):
                    record = answer_record(q, group.video, a)
                    log.write(record)
                    summary.add(record)
                summary.videos += 1
                bar.update(len(group.questions))
    finally:
        summary.wall_s = time.monotonic() - start
        bar.close()
        log.close()
    return summary


def _answer_video(client, group: VideoItems, max_new_tokens: int) -> list[Answer]:
    with open(group.video, "rb") as f:
        video = f.read()
    jobs = [Job(video_prompt(q.question), videos=[video], max_new_tokens=max_new_tokens) for q in group.questions]
    answers = client.generate(jobs)
    for a in answers:
        if a.error:
            raise RuntimeError(a.error)
    return answers


def _progress(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="q", desc="videoqa", disable=not enabled, file=sys.stderr)


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vlserve videoqa", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", help="items JSONL; omit it to generate a synthetic set for the built-in model")
    p.add_argument("--output", required=True, help="answers JSONL (appended to; a rerun skips answered ids)")
    p.add_argument("--url", help="a running `vlserve serve` (default: an in-process Engine)")
    p.add_argument("--api-key")
    p.add_argument("--model", help="checkpoint for the in-process Engine (default: the built-in model)")
    p.add_argument("--parallel-videos", type=int, default=4, help="videos in flight at once")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--num-threads", type=int, help="torch CPU threads for the in-process Engine")
    p.add_argument("--synthetic-videos", type=int, default=8, help="videos in the synthetic set")
    p.add_argument("--seed", type=int, default=12345, help="seed of the synthetic set")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--summary-json", help="also write the summary here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    items = args.input
    if items is None:
        from vlserve.bench.workload_defs import write_videoqa_set

        folder = os.path.splitext(os.path.abspath(args.output))[0] + ".synthetic"
        items = os.path.join(folder, "items.jsonl")
        if not os.path.exists(items):  # a rerun must see the same questions to resume
            items = write_videoqa_set(folder, videos=args.synthetic_videos, seed=args.seed)
        print(f"synthetic set: {items}", file=sys.stderr)
    try:
        read_items(items)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    client = make_client(args.url, args.model, args.api_key,
                         **({"num_threads": args.num_threads} if args.num_threads else {}))
    try:
        summary = run(items, args.output, client, args.parallel_videos, args.max_new_tokens, not args.no_progress)
    finally:
        client.close()
    report = summary.as_dict()
    print(json.dumps(report, indent=2))
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(report, f, indent=2)
    return 1 if summary.errors else 0


if __name__ == "__main__":
    sys.exit(main())
