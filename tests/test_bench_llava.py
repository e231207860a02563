"""`vlserve bench llava`: the llava-bench-in-the-wild layout in, LLaVA's answer format out."""

import json
import os

import pytest

from vlserve import Engine
from vlserve.bench.cli import main as bench_main
from vlserve.bench.client import EngineClient, Job
from vlserve.bench.llava_bench import image_prompt, percentiles, read_questions, report, run, write_answers
from vlserve.bench.workload_defs import write_llava_bench_set
from vlserve.builtin.scenes import IMAGE_QTYPES
from vlserve.testing.tiny import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("llava_model")), seed=9)


@pytest.fixture(scope="module")
def bench_set(tmp_path_factory):
    return write_llava_bench_set(str(tmp_path_factory.mktemp("llava_set")), images=3, seed=4)


def test_round_trip_through_the_engine(model_dir, bench_set, tmp_path):
    questions_path, images_dir = bench_set
    questions = read_questions(questions_path, images_dir)
    assert len({q.image for q in questions}) == 3 and all(q.answer and q.category for q in questions)
    client = EngineClient(Engine(model_dir, max_total_tokens=8192))
    try:
        answers, wall = run(questions, images_dir, client, concurrency=3, max_new_tokens=6)
        with open(os.path.join(images_dir, questions[0].image), "rb") as f:
            [alone] = client.generate([Job(image_prompt(questions[0].text), images=[f.read()], max_new_tokens=6)])
    finally:
        client.close()
    out = tmp_path / "answers.jsonl"
    write_answers(str(out), questions, answers, "tiny")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["question_id"] for line in lines] == [q.question_id for q in questions]
    assert all(set(line) == {"question_id", "prompt", "text", "answer_id", "model_id", "metadata"} for line in lines)
    assert [line["prompt"] for line in lines] == [q.text for q in questions]
    assert lines[0]["text"] == alone.text.strip()  # greedy: concurrency and caching change nothing
    assert len({line["answer_id"] for line in lines}) == len(lines)
    rep = report(questions, answers, wall, 3)
    assert rep["questions"] == len(questions) and rep["errors"] == 0
    assert set(rep["ttft_s"]) == {"p50", "p90", "p99"} and rep["latency_s"]["p50"] <= rep["latency_s"]["p99"]
    assert 0 < rep["cache_hit_rate"] < 1  # several questions per image share the image's KV
    assert 0 <= rep["accuracy"] <= 1 and set(rep["accuracy_by_category"]) <= set(IMAGE_QTYPES)


def test_command_line_writes_answers_and_report(model_dir, bench_set, tmp_path):
    questions_path, images_dir = bench_set
    answers, rep = tmp_path / "a.jsonl", tmp_path / "r.json"
    code = bench_main(["llava", "--questions", questions_path, "--images", images_dir, "--answers", str(answers),
                       "--model", model_dir, "--concurrency", "2", "--max-new-tokens", "3",
                       "--report-json", str(rep)])
    assert code == 0
    assert len(answers.read_text().splitlines()) == len(read_questions(questions_path, images_dir))
    assert json.loads(rep.read_text())["concurrency"] == 2


def test_bad_layout_names_the_problem(tmp_path, bench_set):
    _, images_dir = bench_set
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "image": "nope.png", "text": "hi"}) + "\n")
    with pytest.raises(ValueError, match="q.jsonl:1: image 'nope.png' not found"):
        read_questions(str(q), images_dir)
    q.write_text(json.dumps({"question_id": 1, "text": "hi"}) + "\n")
    with pytest.raises(ValueError, match="missing image"):
        read_questions(str(q), images_dir)


def test_percentiles_nearest_rank():
    values = [float(i) for i in range(1, 101)]
    assert percentiles(values) == {"p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert percentiles([3.0]) == {"p50": 3.0, "p90": 3.0, "p99": 3.0}
    assert percentiles([]) == {}
