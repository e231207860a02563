"""The scene generator: deterministic from its seed, covers every question type, and every answer
agrees with what is actually drawn (checked from the pixels and label masks, not the metadata)."""

import random
import re

import numpy as np
import pytest

from vlserve.builtin import scenes
from vlserve.builtin.evaluate import caption_pairs, is_correct, normalise


def _pixels(scene, frame=0):
    return np.asarray(scene.frames[frame], dtype=np.int32)


def _nearest_colour(rgb) -> str:
    return min(scenes.COLOURS, key=lambda c: sum((a - b) ** 2 for a, b in zip(scenes.COLOURS[c], rgb)))


def _shape_from_fill(mask_k: np.ndarray) -> str:
    ys, xs = np.nonzero(mask_k)
    fill = mask_k.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    # circle pi/4 ~ 0.79, square 1.0, triangle 0.5 of its bounding box
    return "square" if fill > 0.92 else "circle" if fill > 0.65 else "triangle"


def _drawn_objects(scene, frame=0) -> list[dict]:
    """What the pixels show: colour, shape and centroid of every labelled region."""
    mask, img = scene.masks[frame], _pixels(scene, frame)
    out = []
    for k in sorted(set(np.unique(mask)) - {0}):
        region = mask == k
        ys, xs = np.nonzero(region)
        out.append({
            "colour": _nearest_colour(img[region].mean(0)),
            "shape": _shape_from_fill(region),
            "cx": xs.mean(), "cy": ys.mean(),
        })
    return out


def test_same_seed_same_scene_and_questions():
    a, b = scenes.samples(40, seed=7), scenes.samples(40, seed=7)
    assert [(s.question, s.answer, s.qtype) for s in a] == [(s.question, s.answer, s.qtype) for s in b]
    assert all(np.array_equal(np.asarray(x.images[0]), np.asarray(y.images[0])) for x, y in zip(a, b))
    va, vb = scenes.samples(8, seed=7, kind="video"), scenes.samples(8, seed=7, kind="video")
    assert all(len(x.images) == len(y.images) and np.array_equal(np.asarray(x.images[-1]), np.asarray(y.images[-1]))
               for x, y in zip(va, vb))


def test_different_seeds_differ():
    a, b = scenes.samples(20, seed=1), scenes.samples(20, seed=2)
    assert [s.answer for s in a] != [s.answer for s in b]


def test_coverage_of_shapes_colours_counts_and_question_types():
    rng = random.Random(3)
    image_scenes = [scenes.image_scene(rng) for _ in range(300)]
    drawn = [o for sc in image_scenes for o in sc.objects[0]]
    assert {o.shape for o in drawn} == set(scenes.SHAPES) and len(scenes.SHAPES) >= 3
    assert {o.colour for o in drawn} == set(scenes.COLOURS) and len(scenes.COLOURS) >= 6
    assert {len(sc.objects[0]) for sc in image_scenes} == {1, 2, 3}
    assert len({sc.background for sc in image_scenes}) == len(scenes.BACKGROUNDS)
    assert len({round(o.size) for o in drawn}) > 20, "shapes should come in many sizes"

    image, video = scenes.samples(300, seed=4), scenes.samples(120, seed=4, kind="video")
    assert {s.qtype for s in image} == set(scenes.IMAGE_QTYPES)
    assert {s.qtype for s in video} == set(scenes.VIDEO_QTYPES)
    assert {len(s.images) for s in video} == {4, 5, 6, 7, 8}
    for qtype in scenes.IMAGE_QTYPES + scenes.VIDEO_QTYPES:
        questions = {s.question for s in image + video if s.qtype == qtype}
        templates = {re.sub(r"\b(" + "|".join([*scenes.COLOURS, *scenes.SHAPES]) + r")s?\b", "X", q) for q in questions}
        assert len(templates) >= 3, f"{qtype} is phrased only {len(templates)} ways"
    answers = {s.answer for s in image if s.qtype == "position"}
    assert answers == {"left", "right", "top", "bottom"}
    assert {s.answer for s in video if s.qtype == "direction"} == set(scenes.DIRECTIONS)


def test_image_answers_match_the_pixels():
    rng = random.Random(11)
    for _ in range(150):
        sc = scenes.image_scene(rng)
        objs = _drawn_objects(sc)
        assert len(objs) == len(sc.objects[0])
        by_colour = {o["colour"]: o for o in objs}
        assert len(by_colour) == len(objs), "colours within a scene are distinct"
        for qa in sc.qas:
            named_colour = [c for c in scenes.COLOURS if re.search(rf"\b{c}\b", qa.question)]
            named_shape = [s for s in scenes.SHAPES if re.search(rf"\b{s}s?\b", qa.question)]
            if qa.qtype == "colour":
                matches = [o for o in objs if not named_shape or o["shape"] == named_shape[0]]
                assert [o["colour"] for o in matches] == [qa.answer], qa
            elif qa.qtype == "shape":
                target = by_colour[named_colour[0]] if named_colour else objs[0]
                assert target["shape"] == qa.answer, qa
            elif qa.qtype == "position":
                o = by_colour[named_colour[0]]
                assert o["shape"] == named_shape[0]
                half = scenes.CANVAS / 2
                expected = {"left": o["cx"] < half, "right": o["cx"] >= half,
                            "top": o["cy"] < half, "bottom": o["cy"] >= half}
                assert expected[qa.answer], qa
            elif qa.qtype == "count":
                wanted = [o for o in objs if not named_shape or o["shape"] == named_shape[0]]
                assert qa.answer == str(len(wanted)), qa
            elif qa.qtype == "caption":
                assert caption_pairs(qa.answer) == caption_pairs(" ".join(f"{o['colour']} {o['shape']}" for o in objs))
                assert sc.background in qa.answer


def test_video_answers_match_the_pixels():
    rng = random.Random(12)
    for _ in range(60):
        sc = scenes.video_scene(rng)
        assert 4 <= len(sc.frames) <= 8
        first, last = _drawn_objects(sc, 0)[0], _drawn_objects(sc, -1)[0]
        answers = {qa.qtype: qa.answer for qa in sc.qas}
        assert answers["appears"] == first["shape"] == last["shape"]
        assert answers["first_colour"] == first["colour"]
        assert answers["last_colour"] == last["colour"]
        dx, dy = last["cx"] - first["cx"], last["cy"] - first["cy"]
        if "direction" in answers:
            moved = {"right": dx, "left": -dx, "down": dy, "up": -dy}
            assert moved[answers["direction"]] > scenes.CANVAS / 3, (answers, dx, dy)
        else:
            assert abs(dx) < 1 and abs(dy) < 1 and first["colour"] != last["colour"]


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="kind"):
        scenes.samples(1, 0, kind="audio")
    with pytest.raises(ValueError, match="n_frames"):
        scenes.video_scene(random.Random(0), n_frames=1)


def test_scoring_rules():
    assert normalise(" Two. ") == "2" and normalise("Color") == "colour"
    assert is_correct("count", "two", "2")
    assert not is_correct("colour", "red blue", "red")
    ref = "A red circle and a blue square on a white background."
    assert is_correct("caption", "A blue square and a red circle on a black background.", ref)
    assert not is_correct("caption", "A red circle on a white background.", ref)
    assert not is_correct("caption", "A red circle, a blue square and a green triangle.", ref)
    assert not is_correct("caption", "A blue circle and a red square on a white background.", ref)
