"""The independent test set (training/builtin/independent_set.py): deterministic, every type well
represented, expected answers consistent with the drawn pixels, and its scoring and evaluator."""

import numpy as np
import pytest

from training.builtin import independent_set as ind
from training.builtin.evaluate import evaluate_independent


@pytest.fixture(scope="module")
def items():
    return ind.build()


def test_the_set_is_fixed_by_its_seed(items):
    again = ind.build()
    assert [(i.question, i.answer) for i in items] == [(i.question, i.answer) for i in again]
    for a, b in zip(items[::97], again[::97]):
        assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a.images, b.images))


def test_every_type_and_slice_is_well_represented(items):
    for qtype in ind.QTYPES:
        assert sum(i.qtype == qtype for i in items) >= 40, qtype
    sizes = {i.images[0].size for i in items}
    assert len(sizes) >= 10 and any(w != h for w, h in sizes)
    assert sum("crowded" in i.tags for i in items) >= 60
    assert {i.answer for i in items if i.qtype == "count"} >= {"Five.", "Six."}
    assert all(i.answer == ind.CANNOT_TELL for i in items if i.qtype == "outside")


def test_questions_about_every_shape_are_sliced_by_their_count(items):
    """"how many?" over all shapes carries an "N shapes" tag (the report's rows by count), N its answer."""
    sliced = [i for i in items if any(t.endswith(" shapes") for t in i.tags)]
    assert {t for i in sliced for t in i.tags if t.endswith(" shapes")} == {f"{n} shapes" for n in range(1, 7)}
    for i in sliced:
        n = next(int(t.split()[0]) for t in i.tags if t.endswith(" shapes"))
        assert i.qtype == "count" and i.answer == f"{ind.NUMBER[n]}."

def test_issue_49s_exchanges_are_in_it(items):
    asked = {(i.question, i.answer) for i in items}
    assert {("How many shapes are there?", "Two."), ("Where is the square?", "On the right."),
            ("What shape is at the top?", "A square."), ("Is there a red square?", "Yes.")} <= asked


def test_a_colour_answer_is_painted_in_its_picture(items):
    for it in (i for i in items if i.qtype == "colour"):
        rgb = np.array(ind.PAINT[it.answer.rstrip(".").lower()])
        pixels = np.asarray(it.images[0]).reshape(-1, 3)
        assert (np.abs(pixels - rgb).sum(1) == 0).sum() > 20, it.question


def test_crowded_pictures_keep_every_shape_mostly_visible():
    import random

    figs = ind.scatter(random.Random(3), 6, (0.07, 0.13), overlap=True)
    assert len(figs) == 6 and all(ind.visible_share(figs, k) >= 0.6 for k in range(6))
    assert min(ind._apart(a, b) for i, a in enumerate(figs) for b in figs[i + 1:]) < 1.0


def test_relation_scoring():
    assert ind.relation_correct("A square.", "A square.")
    assert ind.relation_correct("A red square.", "A square.")
    assert not ind.relation_correct("A square and a circle.", "A square.")
    assert not ind.relation_correct("A blue square.", "A red square.")
    assert ind.relation_correct("yes", "Yes.") and not ind.relation_correct("No.", "Yes.")


def test_the_evaluator_scores_per_type_and_slice(items):
    # The set is built afresh inside the evaluator, with the same seed: answer by the question's text
    # and the picture's pixels.
    key = lambda question, images: (question, np.asarray(images[-1]).tobytes())  # noqa: E731
    expected = {key(i.question, i.images): i.answer for i in items}
    truthful = lambda prompts, images: [  # noqa: E731
        expected[key(p.removeprefix("USER: ").removesuffix(" ASSISTANT: "), im)] for p, im in zip(prompts, images)]

    class Tok:
        @staticmethod
        def apply_chat_template(messages, **_):
            return "USER: " + messages[0]["content"][-1]["text"] + " ASSISTANT: "

    report, misses = evaluate_independent(lambda p, im: ["Red."] * len(p), Tok)
    assert report.accuracy("colour") < 0.3 and report.accuracy("outside") == 0 and len(misses) > 500
    report, _ = evaluate_independent(truthful, Tok)
    assert report.overall(ind.QTYPES) == 1.0 and report.total["crowded"] >= 60


def test_another_seed_draws_other_pictures_and_several_seeds_pool():
    other = ind.build(50)
    drawn = lambda items: {np.asarray(i.images[0]).tobytes() for i in items[len(ind.issue_cases()):]  # noqa: E731
                           if i.qtype in ("count", "relation")}
    assert drawn(other).isdisjoint(drawn(ind.build(49)))

    class Tok:
        @staticmethod
        def apply_chat_template(messages, **_):
            return messages[0]["content"][-1]["text"]

    report, misses = evaluate_independent(lambda p, im: ["Red."] * len(p), Tok, seeds=(49, 50))
    assert sum(report.total[q] for q in ind.QTYPES) == len(ind.build(49)) + len(other)
    assert len(misses) == sum(report.total[q] - report.correct[q] for q in ind.QTYPES)
