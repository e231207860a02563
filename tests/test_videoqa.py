"""`vlserve videoqa`: answers per question, shared video KV, and resumability (kill -9: test_videoqa_kill.py)."""

import json

import pytest

from vlserve import Engine
from vlserve.bench.client import EngineClient
from vlserve.bench.videoqa import main, read_items, run
from vlserve.bench.workload_defs import write_videoqa_set
from vlserve.testing.tiny import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("vqa_model")), seed=5)


@pytest.fixture(scope="module")
def client(model_dir):
    c = EngineClient(Engine(model_dir, max_total_tokens=8192))
    yield c
    c.close()


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    return write_videoqa_set(str(tmp_path_factory.mktemp("vqa_items")), videos=10, seed=7)


def _all_ids(items_path):
    return [q.qid for _, qs in read_items(items_path) for q in qs]


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_answers_every_question_once_and_shares_the_video(items, client, tmp_path):
    out = str(tmp_path / "answers.jsonl")
    summary = run(items, out, client, parallel_videos=2, max_new_tokens=4, progress=False)
    lines = _lines(out)
    assert sorted(r["id"] for r in lines) == sorted(_all_ids(items))
    assert all(r["id"].rsplit("/", 1)[1].isdigit() for r in lines)  # several questions: ID/0, ID/1, ...
    assert summary.questions == len(lines) and summary.videos == 10 and not summary.errors
    for video in {r["video"] for r in lines}:
        on_video = [r for r in lines if r["video"] == video]
        # the 8 frames' KV is computed for one question and reused by the others
        assert sum(r["cached_tokens"] > 8 * 16 for r in on_video) >= len(on_video) - 1
    assert {"answer", "latency_s", "prompt_tokens", "cached_tokens", "reference", "correct"} <= set(lines[0])
    again = run(items, out, client, max_new_tokens=4, progress=False)  # a rerun skips everything
    assert again.questions == 0 and again.skipped == len(lines) and _lines(out) == lines


def test_torn_last_line_is_cut_and_answered_again(items, client, tmp_path):
    out = tmp_path / "answers.jsonl"
    run(items, str(out), client, max_new_tokens=4, progress=False)
    full = out.read_text().splitlines(keepends=True)
    out.write_text("".join(full[:3]) + full[3][: len(full[3]) // 2])  # a crash mid-write of line 4
    summary = run(items, str(out), client, max_new_tokens=4, progress=False)
    ids = [r["id"] for r in _lines(out)]
    assert sorted(ids) == sorted(_all_ids(items)) and len(ids) == len(set(ids))
    assert summary.skipped == 3


def test_single_question_items_and_bad_input(tmp_path, items, client):
    video = read_items(items)[0][0]
    good = tmp_path / "items.jsonl"
    good.write_text(json.dumps({"id": "a", "video": video, "question": "What shape appears in the video?"}) + "\n")
    out = tmp_path / "out.jsonl"
    run(str(good), str(out), client, max_new_tokens=4, progress=False)
    assert [r["id"] for r in _lines(out)] == ["a"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "b", "video": video}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: give exactly one of 'question' or 'questions'"):
        read_items(str(bad))
    bad.write_text(json.dumps({"id": "a", "video": video, "question": "q"}) + "\n"
                   + json.dumps({"id": "a", "video": video, "question": "q"}) + "\n")
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        read_items(str(bad))
    assert main(["--input", str(tmp_path / "missing.jsonl"), "--output", str(out)]) == 2
