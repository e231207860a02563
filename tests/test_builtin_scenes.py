"""The scene generator: deterministic from its seed, covers the world issue 21 asks for (1-4 shapes
anywhere and of any size, overlaps, three kinds of background, several picture shapes, eight
directions of motion, appearing and disappearing, pictures with no shape), and every answer agrees
with what is actually drawn: read back from the pixels of the processor's view and the label masks,
not from the metadata."""

import random
import re

import numpy as np
import pytest
from PIL import Image

from vlserve.builtin import scenes
from vlserve.builtin.answers import caption_pairs, is_correct, normalise


def _view_pixels(scene, frame=0) -> np.ndarray:
    """The centre square the processor keeps, at the masks' resolution."""
    img = scene.frames[frame]
    w, h = img.size
    side = min(w, h)
    box = ((w - side) // 2, (h - side) // 2, (w - side) // 2 + side, (h - side) // 2 + side)
    return np.asarray(img.crop(box).resize((scenes.CANVAS, scenes.CANVAS), Image.NEAREST), dtype=np.int32)


def _region_colour(pixels: np.ndarray) -> str:
    """The palette colour most of a region's pixels are nearest to, counting the darker outline tone
    (0.6 x the fill, as scenes.render draws it) as its colour: a small outlined shape is mostly outline."""
    names = list(scenes.COLOURS)
    tones = np.array([scenes.COLOURS[c] for c in names] + [[0.6 * v for v in scenes.COLOURS[c]] for c in names])
    nearest = ((pixels[:, None, :] - tones[None]) ** 2).sum(-1).argmin(1) % len(names)
    return names[np.bincount(nearest, minlength=len(names)).argmax()]


def _shape_from_fill(region: np.ndarray) -> str:
    ys, xs = np.nonzero(region)
    fill = region.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    # circle pi/4 ~ 0.79, square 1.0, triangle 0.5 of its bounding box
    return "square" if fill > 0.92 else "circle" if fill > 0.65 else "triangle"


def _drawn_objects(scene, frame=0) -> list[dict]:
    """What the pixels and mask show: colour, shape (when not covered) and centre of every region."""
    mask, img = scene.masks[frame], _view_pixels(scene, frame)
    out = []
    for k, obj in enumerate(scene.objects[frame], start=1):
        region = mask == k
        ys, xs = np.nonzero(region)
        whole = region.sum() >= 0.98 * scenes.shape_mask(obj).sum()
        out.append({
            "colour": _region_colour(img[region]),
            "shape": _shape_from_fill(region) if whole else obj.shape,
            "checked_shape": whole,
            "cx": (xs.mean() + 0.5) / scenes.CANVAS, "cy": (ys.mean() + 0.5) / scenes.CANVAS,
        })
    return out


def test_same_seed_same_scene_and_questions():
    for kind in ("image", "video", "outside"):
        a, b = scenes.samples(24, seed=7, kind=kind), scenes.samples(24, seed=7, kind=kind)
        assert [(s.question, s.answer, s.qtype) for s in a] == [(s.question, s.answer, s.qtype) for s in b]
        assert all(len(x.images) == len(y.images) and np.array_equal(np.asarray(x.images[-1]), np.asarray(y.images[-1]))
                   for x, y in zip(a, b))


def test_different_seeds_differ():
    a, b = scenes.samples(20, seed=1), scenes.samples(20, seed=2)
    assert [s.answer for s in a] != [s.answer for s in b]


def test_coverage_of_the_world():
    rng = random.Random(3)
    image_scenes = [scenes.image_scene(rng) for _ in range(300)]
    drawn = [o for sc in image_scenes for o in sc.objects[0]]
    assert {o.shape for o in drawn} == set(scenes.SHAPES)
    assert {o.colour for o in drawn} == set(scenes.COLOURS)
    assert {len(sc.objects[0]) for sc in image_scenes} == {1, 2, 3, 4}
    sizes = [o.size for o in drawn]
    assert min(sizes) < 0.2 and max(sizes) > 0.8, "from small to filling the frame"
    assert {sc.frames[0].size for sc in image_scenes} == set(scenes.PICTURE_SIZES)
    overlapping = sum(any((sc.masks[0] == k + 1).sum() < scenes.shape_mask(o).sum()
                          for k, o in enumerate(sc.objects[0]))
                      for sc in image_scenes)
    assert overlapping > 10, "some shapes overlap"
    centres = [xy for sc in image_scenes for xy in scenes.centroids(sc.masks[0], len(sc.objects[0]))]
    assert {(scenes.horizontal(x), scenes.vertical(y)) for x, y in centres} >= {
        (h, v) for h in ("left", "centre", "right") for v in ("top", "centre", "bottom")}, "shapes anywhere"

    image, video = scenes.samples(600, seed=4), scenes.samples(200, seed=4, kind="video")
    outside = scenes.samples(30, seed=4, kind="outside")
    assert {s.qtype for s in image} == set(scenes.IMAGE_QTYPES)
    assert {s.qtype for s in video} == set(scenes.VIDEO_QTYPES)
    assert {s.answer for s in outside} == {scenes.CANNOT_TELL}
    assert {len(s.images) for s in video} == {4, 5, 6, 7, 8}
    for qtype in scenes.IMAGE_QTYPES + scenes.VIDEO_QTYPES:
        questions = {s.question for s in image + video if s.qtype == qtype}
        templates = {re.sub(r"\b(" + "|".join([*scenes.COLOURS, *scenes.SHAPES]) + r")s?\b", "X", q) for q in questions}
        assert len(templates) >= 3, f"{qtype} is phrased only {len(templates)} ways"
    asked = " ".join(s.question for s in image)
    for phrasing in ("What colour", "What color", "Which shape", "How many", "Where is", "Is there a"):
        assert phrasing in asked, phrasing
    assert {s.answer for s in image if s.qtype == "exists"} == {"Yes.", "No."}
    assert {s.answer for s in image if s.qtype == "count"} >= {"None.", "One.", "Two.", "Three.", "Four."}
    assert {s.answer for s in video if s.qtype == "direction"} == {d.capitalize() + "." for d in scenes.DIRECTIONS}
    assert {s.answer.split()[1] for s in video if s.qtype == "event"} == {"moves", "changes", "appears.", "disappears."}


def test_answers_are_short_capitalised_and_have_no_leading_space():
    for s in scenes.samples(120, seed=5) + scenes.samples(40, seed=5, kind="video"):
        assert s.answer == s.answer.strip() and s.answer[0].isupper() and s.answer.endswith(".")
        assert len(s.answer.split()) <= (16 if s.qtype == "caption" else 8), s.answer


def test_image_answers_match_the_pixels():
    rng = random.Random(11)
    checked_shapes = 0
    for _ in range(150):
        sc = scenes.image_scene(rng)
        objs = _drawn_objects(sc)
        assert set(np.unique(sc.masks[0])) == set(range(len(objs) + 1)), "every shape is visible"
        for o, meta in zip(objs, sc.objects[0]):
            assert o["colour"] == meta.colour
            assert o["shape"] == meta.shape
            checked_shapes += o["checked_shape"]
        for qa in sc.qas:
            named_colour = [c for c in scenes.COLOURS if re.search(rf"\b{c}\b", qa.question)]
            named_shape = [s for s in scenes.SHAPES if re.search(rf"\b{s}s?\b", qa.question)]
            if qa.qtype == "colour":
                matches = [o for o in objs if not named_shape or o["shape"] == named_shape[0]]
                assert [o["colour"].capitalize() + "." for o in matches] == [qa.answer], qa
            elif qa.qtype == "shape":
                matches = [o for o in objs if not named_colour or o["colour"] == named_colour[0]]
                assert len(matches) == 1 and qa.answer.endswith(f" {matches[0]['shape']}."), qa
            elif qa.qtype == "position":
                (o,) = [o for o in objs if (o["colour"], o["shape"]) == (named_colour[0], named_shape[0])]
                h, v = scenes.horizontal(o["cx"]), scenes.vertical(o["cy"])
                said = set(re.findall(r"left|right|top|bottom|centre", qa.answer))
                assert said <= {h, v} and said, (qa, h, v)
            elif qa.qtype == "count":
                wanted = [o for o in objs if not named_shape or o["shape"] == named_shape[0]]
                assert normalise(qa.answer) == str(len(wanted)), qa
            elif qa.qtype == "exists":
                there = any((not named_colour or o["colour"] == named_colour[0])
                            and (not named_shape or o["shape"] == named_shape[0]) for o in objs)
                assert qa.answer == ("Yes." if there else "No."), qa
            elif qa.qtype == "caption":
                described = " ".join(f"a {o['colour']} {o['shape']}" for o in objs)
                assert caption_pairs(qa.answer) == caption_pairs(described)
    assert checked_shapes > 200


def test_video_answers_match_the_pixels():
    rng = random.Random(12)
    kinds = set()
    for _ in range(80):
        sc = scenes.video_scene(rng)
        assert 4 <= len(sc.frames) <= 8
        answers = {qa.qtype: qa.answer for qa in sc.qas}
        present = [bool(m.any()) for m in sc.masks]
        event = answers["event"]
        if event == "It appears.":
            assert not present[0] and present[-1] and present == sorted(present)
        elif event == "It disappears.":
            assert present[0] and not present[-1] and present == sorted(present, reverse=True)
        else:
            assert all(present)
        seen = [_drawn_objects(sc, f)[0] for f in range(len(sc.frames)) if present[f]]
        assert all(o["shape"] in answers["appears"] for o in seen)
        if "first_colour" in answers:
            assert answers["first_colour"] == seen[0]["colour"].capitalize() + "."
        if "last_colour" in answers:
            assert answers["last_colour"] == seen[-1]["colour"].capitalize() + "."
        dx, dy = seen[-1]["cx"] - seen[0]["cx"], seen[-1]["cy"] - seen[0]["cy"]
        if "direction" in answers:
            kinds.add("move")
            want = scenes.DIRECTIONS[answers["direction"].rstrip(".").lower()]
            for moved, sign in ((dx, want[0]), (dy, want[1])):
                assert (abs(moved) < 0.01) if sign == 0 else (moved * sign > 0.3), (answers, dx, dy)
        else:
            assert abs(dx) < 0.01 and abs(dy) < 0.01
            kinds.add(event.split()[1])
    assert kinds == {"move", "changes", "appears.", "disappears."}


def test_outside_pictures_have_no_shape_and_one_answer():
    rng = random.Random(13)
    for kind in scenes.OUTSIDE_KINDS:
        sc = scenes.outside_scene(rng, kind)
        assert not sc.masks[0].any() and sc.objects == [[]]
        assert {qa.answer for qa in sc.qas} == {scenes.CANNOT_TELL}
        assert {qa.qtype for qa in sc.qas} == {scenes.OUTSIDE_QTYPE}


def test_photograph_like_noise_falls_as_one_over_f():
    """The clutter pictures' background has a photograph's spectrum: amplitude ~ 1 / f ** alpha."""
    field = scenes._one_over_f(128, 128, 1.2, np.random.default_rng(0))
    assert abs(field.std() - 1.0) < 1e-3
    amplitude = np.abs(np.fft.fft2(field))
    f = np.hypot(np.fft.fftfreq(128)[:, None], np.fft.fftfreq(128)[None, :])
    bands = [(0.02, 0.04), (0.08, 0.16), (0.25, 0.5)]
    mean_amp = [amplitude[(f >= lo) & (f < hi)].mean() for lo, hi in bands]
    mean_f = [f[(f >= lo) & (f < hi)].mean() for lo, hi in bands]
    slope = np.polyfit(np.log(mean_f), np.log(mean_amp), 1)[0]
    assert -1.35 < slope < -1.05, slope


def test_clutter_pictures_have_no_flat_region():
    """Every blob is shaded and textured: no 8x8 window of a clutter picture is one colour."""
    rng = random.Random(5)
    for i in range(6):
        img = np.asarray(scenes._clutter(scenes.View(128, 96), rng, np.random.default_rng(i)), dtype=np.float32)
        windows = img[:96, :128].reshape(12, 8, 16, 8, 3).std(axis=(1, 3)).max(axis=-1)
        assert windows.min() > 2.0, windows.min()  # flat blobs (no light, no texture): 0.9-2.6


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="kind"):
        scenes.samples(1, 0, kind="audio")
    with pytest.raises(ValueError, match="n_frames"):
        scenes.video_scene(random.Random(0), n_frames=1)
    with pytest.raises(ValueError, match="kind"):
        scenes.video_scene(random.Random(0), 4, kind="spin")
    with pytest.raises(ValueError, match="kind"):
        scenes.outside_scene(random.Random(0), "video")


def test_scoring_rules():
    assert normalise(" Two. ") == "2" and normalise("Color") == "colour" and normalise("None.") == "0"
    assert normalise("On the left.") == normalise("left") and normalise("A circle.") == "circle"
    assert is_correct("count", "two", "Two.")
    assert not is_correct("colour", "red blue", "Red.")
    assert is_correct(scenes.OUTSIDE_QTYPE, scenes.CANNOT_TELL, scenes.CANNOT_TELL)
    assert not is_correct(scenes.OUTSIDE_QTYPE, "Red.", scenes.CANNOT_TELL)
    ref = "A red circle and two blue squares."
    assert is_correct("caption", "Two blue squares and a red circle.", ref)
    assert not is_correct("caption", "A red circle and a blue square.", ref)
    assert not is_correct("caption", "A red circle, two blue squares and a green triangle.", ref)
    assert not is_correct("caption", "A blue circle and two red squares.", ref)


def test_captions_name_colours_in_a_fixed_order_then_shapes():
    """Captions follow the vocabulary's order (COLOURS, then SHAPES), not the picture's, so the next
    phrase depends only on what was written and what the picture has."""
    rng = random.Random(17)
    rank = {(c, s): (i, j) for i, c in enumerate(scenes.COLOURS) for j, s in enumerate(scenes.SHAPES)}
    seen_multi = 0
    for _ in range(200):
        sc = scenes.image_scene(rng)
        caption = next(qa.answer for qa in sc.qas if qa.qtype == "caption")
        named = [(c, s) for _, c, s in re.findall(
            r"\b(a|an|two|three|four)\s+(" + "|".join(scenes.COLOURS) + r")\s+(" + "|".join(scenes.SHAPES) + r")s?\b",
            caption.lower())]
        assert named == sorted(set(named), key=rank.__getitem__), caption
        seen_multi += len(named) > 1
    assert seen_multi > 50


@pytest.mark.parametrize("grid", [4, 6, 8])  # 6 (96 px in 16 px patches) does not divide the canvas
def test_patch_blocks_follow_the_model_grid(grid):
    mask = np.zeros((scenes.CANVAS, scenes.CANVAS), np.uint8)
    mask[:, : scenes.CANVAS // 2] = 1  # left half
    mask[scenes.CANVAS // 4 * 3:, :] = 2  # bottom quarter, over it
    blocks = scenes.patch_blocks(mask, grid)
    assert blocks.shape[0] == grid * grid
    majority = np.array([np.bincount(b, minlength=3).argmax() for b in blocks]).reshape(grid, grid)
    rows, cols = np.indices((grid, grid))
    expected = np.where((rows + 0.5) / grid > 0.75, 2, np.where((cols + 0.5) / grid < 0.5, 1, 0))
    assert (majority == expected).all()
