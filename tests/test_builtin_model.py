"""The built-in model answers freshly generated questions about real pixels, through vlserve's engine.

Floors are set from the measured held-out accuracy (docs/builtin-model.md) with room for a
small sample. Controls: blank images show that a pipeline dropping the image would fail; mirrored
images (left/right swapped, references kept) that one flipping it would fail the position and
direction floors on the questions whose answer names a side. A second test set, drawn and phrased by
a different program (tests/helpers/builtin_independent_set.py), stands for pictures a user draws.
"""

import re

import pytest
from PIL import ImageOps

import helpers.builtin_independent_set as independent
from training.builtin import independent_set
from vlserve.builtin import scenes
from training.builtin.evaluate import evaluate, prompt_for, with_shots
from vlserve.model.builtin import BUILTIN_MODEL_DIR

pytestmark = pytest.mark.slow

assert (BUILTIN_MODEL_DIR / "config.json").exists(), "the built-in checkpoint is missing from vlserve/builtin_model"

# Set a little under what the committed checkpoint (run 7) measured on these samples (20 per type:
# image 96.7%, colour, shape, position and yes/no 100%, count 85%, captions 95%; video and "cannot
# tell" 100%; blank images 0%). Twenty questions is a small sample (docs/builtin-model.md's held-out
# set, 500 questions per type: count 90.8%, captions 92.4%, images 95.9%), so the count and caption floors
# leave room for a few answers that move with the CPU's rounding (an AVX2 machine takes other GEMM
# paths).
OVERALL_FLOOR = {"image": 0.90, "video": 0.95, "outside": 0.95}
PER_TYPE_FLOOR = {q: 0.85 for q in scenes.IMAGE_QTYPES + scenes.VIDEO_QTYPES} | {
    "count": 0.75, "caption": 0.80}
PER_KIND = 20  # questions per question type (outside: 3 x PER_KIND pictures)
QTYPES = {"image": scenes.IMAGE_QTYPES, "video": scenes.VIDEO_QTYPES, "outside": (scenes.OUTSIDE_QTYPE,)}
MIRROR_SENSITIVE = {"image": "position", "video": "direction"}
BLANK_MARGIN = 0.50
# A question behind two worked examples about other pictures (examples/few_shot_qa.py's prompt):
# run 7 answers 83% of these 60 (88.0% of docs/builtin-model.md's 600); run 6, never shown two
# pictures in one prompt, answered 42.5% of the 600, mostly about the first shot's picture.
FEW_SHOT_FLOOR = 0.65
# Issue 49's independent set (training/builtin/independent_set.py, 647 questions): stage 11 answers 93.4%
# of it (docs/builtin-model.md; stage 6 82.1%), 38 of its 40 questions from outside the model's world
# with the fixed sentence (issue 49's bar: 95%), and all four exchanges issue 49 reports (stage 6 answered
# "What shape is at the top?" over a square above a triangle with "A triangle.").
OUTSIDE_WORLD_FLOOR = 0.95
ISSUE_49_SET_FLOOR = 0.92
INDEPENDENT_FLOOR = 0.90  # issue 21's bar; measured 97.1%: 94/95 drawn pictures, 6/8 photograph (docs/builtin-model.md)


@pytest.fixture(scope="module")
def engine():
    from vlserve import Engine

    with Engine(max_total_tokens=32768) as e:
        yield e


def _generate(engine):
    def generate(prompts, images):
        outs = engine.generate(prompt=prompts, image_data=images,
                               sampling_params={"max_new_tokens": 24, "temperature": 0})
        return [o["text"] for o in outs]
    return generate


def _data(kind: str):
    n = PER_KIND * (3 if kind == "outside" else len(QTYPES[kind]))
    return scenes.samples(n, seed=98765 + ("image", "video", "outside").index(kind), kind=kind)


@pytest.mark.parametrize("kind", ["image", "video"])
def test_accuracy_on_fresh_questions_far_above_blank_images(engine, kind):
    """Overall and per-type floors; catches a pipeline that loses the image or one question type."""
    data = _data(kind)
    report = evaluate(_generate(engine), data, engine.tokenizer)
    real = report.overall(QTYPES[kind])
    blank = evaluate(_generate(engine), data, engine.tokenizer, blank=True).overall(QTYPES[kind])
    for qtype in QTYPES[kind]:
        assert report.total[qtype] == PER_KIND
        assert report.accuracy(qtype) >= PER_TYPE_FLOOR[qtype], f"{qtype}: {report.accuracy(qtype):.1%}"
    assert real >= OVERALL_FLOOR[kind], f"{kind} accuracy {real:.1%} under the floor {OVERALL_FLOOR[kind]:.0%}"
    assert real >= blank + BLANK_MARGIN, f"{kind}: {real:.1%} with images vs {blank:.1%} with blank ones"


def test_pictures_without_a_known_shape_get_the_fixed_answer(engine):
    report = evaluate(_generate(engine), _data("outside"), engine.tokenizer)
    accuracy = report.accuracy(scenes.OUTSIDE_QTYPE)
    assert accuracy >= OVERALL_FLOOR["outside"], f"'cannot tell' on {accuracy:.1%} of out-of-world pictures"


@pytest.mark.parametrize("kind", ["image", "video"])
def test_mirrored_images_fail_the_left_right_floor(engine, kind):
    """The control for the per-type floors: a pipeline that mirrors the pixels fails position
    (image) or direction (video) on the questions whose answer names a side."""
    qtype = MIRROR_SENSITIVE[kind]
    data = [s for s in scenes.samples(12 * PER_KIND, seed=4321, kind=kind)
            if s.qtype == qtype and re.search(r"\b(left|right)\b", s.answer)]
    assert len(data) >= 15
    for s in data:
        s.images = [ImageOps.mirror(im) for im in s.images]
    mirrored = evaluate(_generate(engine), data, engine.tokenizer).accuracy(qtype)
    assert mirrored < PER_TYPE_FLOOR[qtype] - 0.2, f"{kind} {qtype} with mirrored images: {mirrored:.1%}"


def test_a_few_shot_prompt_is_answered_about_its_last_picture(engine):
    data = with_shots(scenes.samples(60, seed=2468, kind="image"), shots=2, seed=1357)
    report = evaluate(_generate(engine), data, engine.tokenizer)
    accuracy = report.overall(list(report.total))
    assert accuracy >= FEW_SHOT_FLOOR, f"{accuracy:.1%} behind two worked examples"


def test_independent_test_set(engine):
    """Pictures drawn by another program, phrased another way, scored by keywords."""
    items = independent.build()
    result = independent.score(items, independent.ask_engine(engine, items))
    assert result.accuracy() >= INDEPENDENT_FLOOR, (f"{result.accuracy():.1%}", result.wrong)
    issue_cases = [w for w in result.wrong if w[3]]
    assert not issue_cases, f"issue 21's own pictures answered wrong: {issue_cases}"


def test_issue_49s_exchanges_and_questions_from_outside_its_world(engine):
    items = independent_set.issue_cases() + independent_set.build()
    answers = _generate(engine)([prompt_for(i.question, len(i.images), engine.tokenizer) for i in items],
                                [i.images for i in items])
    right = [independent_set.is_right(i, a) for i, a in zip(items, answers)]
    exchanges = {i.question: a for i, a, ok in zip(items[:4], answers, right) if not ok}
    assert not exchanges, exchanges
    overall = sum(right[4:]) / len(right[4:])
    assert overall >= ISSUE_49_SET_FLOOR, f"{overall:.1%} of the independent set"
    outside = [ok for i, ok in zip(items[4:], right[4:]) if i.qtype == "outside"]
    assert len(outside) == 40 and sum(outside) / len(outside) >= OUTSIDE_WORLD_FLOOR, (
        f"'cannot tell' on {sum(outside)} of {len(outside)} questions from outside its world")


def test_prompt_uses_the_checkpoint_chat_template_and_answers_have_no_leading_space(engine):
    text = prompt_for("What colour is the circle?", 1, engine.tokenizer)
    assert "<image>" in text and text.endswith("ASSISTANT: ")
    data = _data("image")[:12]
    answers = _generate(engine)([prompt_for(s.question, 1, engine.tokenizer) for s in data], [s.images for s in data])
    assert all(a and a == a.strip() for a in answers), answers


def test_error_breakdown_measures_each_scene_from_its_masks():
    """The breakdown that chose 96 px: shape counts, sizes and overlap come from the scene itself."""
    from training.builtin import error_breakdown

    cases = error_breakdown.draw_cases(60, seed=5)
    assert {c.qa.qtype for c in cases} == {"count", "caption"}
    for c in cases:
        assert c.shapes == len(c.scene.objects[0])
        assert c.smallest == min(s.size for s in c.scene.objects[0])
        assert 0 < c.least_visible <= 1
    assert all(c.least_visible == 1.0 for c in cases if c.shapes == 1)  # nothing can cover a lone shape
    overlapping = [c for c in cases if "overlapping" in error_breakdown.groups(c)]
    assert 0 < len(overlapping) < len(cases)
    covered = overlapping[0]
    assert any((covered.scene.masks[0] == k + 1).sum() < scenes.shape_mask(s).sum()
               for k, s in enumerate(covered.scene.objects[0]))
