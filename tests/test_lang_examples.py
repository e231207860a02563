"""The programs in examples/ run against a real server on the built-in model and answer right."""

import os
import re
import sys

import pytest

from helpers.lang_helpers import RecordingEndpoint, builtin_server
from helpers.server_helpers import assert_leak_free

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import essay_judge  # noqa: E402
import few_shot_qa  # noqa: E402
import image_qa  # noqa: E402
import tree_of_thought  # noqa: E402
import video_qa  # noqa: E402


@pytest.fixture(scope="module")
def url():
    engine, server = builtin_server()
    yield server.url
    assert_leak_free(engine, server.url)
    server.stop()
    engine.shutdown()


def _mostly_right(results) -> bool:
    """The examples answer right at least half the time (docs/builtin-model.md: 93% on single images,
    100% on video); a lost image answers nothing right ("I can only see…")."""
    return sum(answer == truth for _, answer, truth in results) >= 0.5 * len(results)


def _sees_the_pictures(results) -> bool:
    """The few-shot prompt holds three pictures, which training never shows together: the model
    answers 2 of its 5 right. A lost picture would be declined ("I can only see…") every time."""
    right = sum(answer == truth for _, answer, truth in results)
    return right >= 2 and not any("only see" in answer for _, answer, _ in results)


def test_image_qa(url):
    results = image_qa.main(RecordingEndpoint(url))
    assert len(results) >= 6 and _mostly_right(results)


def test_video_qa(url):
    results = video_qa.main(RecordingEndpoint(url))
    assert len(results) >= 3 and _mostly_right(results)


def test_few_shot_qa_caches_the_shots_once(url):
    endpoint = RecordingEndpoint(url)
    results = few_shot_qa.main(endpoint)
    assert _sees_the_pictures(results), results
    _, precache, _ = endpoint.requests()[0]
    assert precache["sampling_params"] == {"max_new_tokens": 0} and len(precache["image_data"]) == 2
    assert precache["text"].count("</s>") == 2  # both worked examples, up to the question's image


def test_tree_of_thought(url):
    endpoint = RecordingEndpoint(url)
    results = tree_of_thought.main(endpoint, seeds=[40, 41])
    assert len(results) == 2 and all(answer for _, answer, _ in results)
    state = tree_of_thought.tree_of_thought.run(picture=image_qa_picture(), question="Count the circles.",
                                                backend=endpoint)
    assert [len(a) for a in state["answer"]] == [2, 2, 2]
    assert {v for vs in state["verdict"] for v in vs} <= {" yes", " no"}
    assert state["final"] in {a.strip() for answers in state["answer"] for a in answers}


def image_qa_picture() -> bytes:
    from common import scene

    return scene(40)[0]


def test_essay_judge(url):
    results = essay_judge.main(RecordingEndpoint(url))
    assert len(results) == 4
    for r in results:
        assert re.fullmatch(essay_judge.GRADE_REGEX, r["grade"])
        assert r["related"] in ("yes", "no") and len(r["judgments"]) == 3
