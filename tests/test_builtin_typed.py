"""The typed world (vlserve/builtin/typed.py, phrasing.py): crowded pictures, relation questions whose
answers agree with the label masks, out-of-world questions, typed rewrites that keep the words that
carry the meaning; and the plain training stream left as it was."""

import random
import re

import pytest

from training.builtin.train import TrainArgs, image_or_outside
from vlserve.builtin import scenes, typed
from vlserve.builtin.phrasing import retype

MEANING = re.compile(r"\b(" + "|".join([*scenes.COLOURS, *scenes.SHAPES, "above", "below", "left", "right", "top",
                                        "bottom", "biggest", "smallest", "many"]) + r")s?\b")


@pytest.fixture(scope="module")
def drawn():
    rng = random.Random(7)
    return [typed.typed_scene(rng) for _ in range(150)]


def test_typed_scenes_are_fixed_by_their_seed():
    a, b = typed.samples(40, seed=3), typed.samples(40, seed=3)
    assert [(s.question, s.answer) for s in a] == [(s.question, s.answer) for s in b]
    assert {s.qtype for s in typed.samples(80, seed=4)} == set(typed.QTYPES)


def test_retyping_keeps_the_words_that_carry_the_meaning():
    rng = random.Random(1)
    plain = [qa.question for _ in range(60) for qa in scenes.image_scene(rng).qas]
    changed = 0
    for q in plain:
        t = retype(q, rng)
        assert MEANING.findall(t.lower()) == MEANING.findall(q.lower()), (q, t)
        changed += t != q
    assert changed > len(plain) // 2


def test_crowded_pictures_have_five_or_six_mostly_visible_shapes():
    rng = random.Random(2)
    for _ in range(20):
        shapes, mask = typed.crowded_shapes(rng)
        assert len(shapes) in (5, 6)
        for k, s in enumerate(shapes, start=1):
            assert (mask == k).sum() >= typed.CROWDED_VISIBLE * scenes.shape_mask(s).sum()


@pytest.mark.parametrize("share,crowded", [(1.0, 20), (0.0, 0)])
def test_the_crowded_share_decides_how_many_pictures_are_crowded(share, crowded):
    rng = random.Random(3)
    scenes_drawn = [typed.typed_scene(rng, typed.PictureMix(crowded_share=share)) for _ in range(20)]
    assert sum(len(s.objects[0]) >= 5 for s in scenes_drawn) == crowded


def test_the_crowded_counts_decide_how_many_shapes_a_crowded_picture_has():
    """Crowded pictures of four (besides five and six), so that small shapes do not mean "five or six";
    train.py passes --crowded-counts through to them."""
    rng = random.Random(4)
    drawn = [typed.typed_scene(rng, typed.PictureMix(crowded_share=1.0, crowded_counts=(4, 5, 6))) for _ in range(30)]
    assert {len(s.objects[0]) for s in drawn} == {4, 5, 6}
    mix = TrainArgs(out="unused", crowded_share=1.0, crowded_counts=(4,)).picture_mix
    fours = [image_or_outside(random.Random(seed), typed_share=1.0, mix=mix) for seed in range(12)]
    assert {len(s.objects[0]) for s in fours if s.objects[0]} == {4}


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_the_repeat_shares_decide_whether_shapes_share_a_colour(share):
    """Colours drawn with repeats, so that counting cannot lean on counting colours; train.py passes
    --crowded-repeat-share and --plain-repeat-share through."""
    mix = TrainArgs(out="unused", crowded_share=0.5, crowded_repeat_share=share, plain_repeat_share=share).picture_mix
    rng = random.Random(5)
    drawn = [typed.typed_scene(rng, mix) for _ in range(60)]
    many = [s.objects[0] for s in drawn if len(s.objects[0]) >= 3]
    repeated = [len({sh.colour for sh in shapes}) < len(shapes) for shapes in many]
    crowded = [r for shapes, r in zip(many, repeated) if len(shapes) >= 5]
    if share == 0.0:
        assert not any(repeated)
    else:
        assert sum(repeated) > 0.5 * len(repeated) and sum(crowded) > 0.85 * len(crowded)


def test_counts_reach_six_and_out_of_world_questions_get_the_fixed_sentence(drawn):
    counts = {qa.answer for sc in drawn for qa in sc.qas if qa.qtype == "count"}
    assert {"Five.", "Six."} <= counts
    foreign = [qa for sc in drawn for qa in sc.qas if qa.qtype == scenes.OUTSIDE_QTYPE]
    assert len(foreign) > 40 and {qa.answer for qa in foreign} == {scenes.CANNOT_TELL}
    for qa in foreign:  # about nothing this world has
        assert not re.search(r"\b(" + "|".join(scenes.SHAPES) + r")s?\b", qa.question.lower()), qa.question


def _named(question: str, shapes) -> int | None:
    """The index of the shape a relation question names after "the" (colour and kind, or kind alone)."""
    q = question.lower()
    for k, s in enumerate(shapes):
        if re.search(rf"the {s.colour} {s.shape}\b", q):
            return k
    kinds = [k for k, s in enumerate(shapes) if re.search(rf"the {s.shape}\b", q)]
    return kinds[0] if len(kinds) == 1 else None


def test_relation_answers_agree_with_the_masks(drawn):
    checked = 0
    for sc in drawn:
        shapes, mask = sc.objects[0], sc.masks[0]
        centres = scenes.centroids(mask, len(shapes))
        area = [(mask == k + 1).sum() for k in range(len(shapes))]
        for qa in (qa for qa in sc.qas if qa.qtype == typed.RELATION_QTYPE):
            q, k = qa.question.lower(), qa.about
            if qa.answer not in ("Yes.", "No."):
                assert qa.answer.lower().rstrip(".").endswith(shapes[k].shape)
            others = [j for j in range(len(shapes)) if j != k]
            if re.search(r"biggest|largest", q):
                assert all(area[k] > area[j] for j in others)
            elif re.search(r"smallest|littlest", q):
                assert all(area[k] < area[j] for j in others)
            elif re.search(r"top|highest|uppermost", q) and "above" not in q:
                assert all(centres[k][1] < centres[j][1] for j in others)
            elif re.search(r"\bbottom|lowest", q):
                assert all(centres[k][1] > centres[j][1] for j in others)
            elif re.search(r"(above|over|on top of|higher than|up from) the", q) and qa.answer not in ("Yes.", "No."):
                ref = _named(q, shapes)
                assert ref is not None and centres[k][1] < centres[ref][1] - typed.GAP, qa
            else:
                continue
            checked += 1
    assert checked > 60


def test_a_plain_stream_draws_exactly_as_before():
    a, b = random.Random(5), random.Random(5)
    for _ in range(10):
        got = image_or_outside(a)
        want = scenes.outside_scene(b) if b.random() < 0.12 else scenes.image_scene(b)
        assert [qa.question for qa in got.qas] == [qa.question for qa in want.qas]


def test_the_chat_template_puts_a_shouted_message_in_lower_case():
    from transformers import AutoTokenizer

    from training.builtin.tokenizer import BUILTIN_CHAT_TEMPLATE
    from vlserve.model.builtin import BUILTIN_MODEL_DIR

    tok = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    tok.chat_template = BUILTIN_CHAT_TEMPLATE
    render = lambda text: tok.apply_chat_template(  # noqa: E731
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}], tokenize=False,
        add_generation_prompt=True)
    assert render("WHERE IS THE RED SQUARE?") == "<s>USER: <image>\nwhere is the red square? ASSISTANT: "
    assert render("Is the RED square there?").endswith("\nIs the RED square there? ASSISTANT: ")
    assert render("how many?").endswith("\nhow many? ASSISTANT: ")


def _yes_no_relation(question: str):
    """(relation, name of A, name of B) of a yes/no relation question, from typed.YESNO_RELATIONS."""
    name = r"((?:(?:" + "|".join(scenes.COLOURS) + r") )?(?:" + "|".join(scenes.SHAPES) + r"))"
    for rel, forms in typed.YESNO_RELATIONS.items():
        for form in forms:
            pattern = re.escape(form).replace(r"\{a\}", name).replace(r"\{b\}", name)
            m = re.search(pattern, question, re.IGNORECASE)
            if m:
                return rel, m.group(1).lower(), m.group(2).lower()
    return None


def test_yes_no_relation_answers_agree_with_the_masks(drawn):
    """Above, below, left and right, asked either way round: Yes exactly when A lies on that side of B."""
    seen = set()
    for sc in drawn:
        shapes, mask = sc.objects[0], sc.masks[0]
        centres = scenes.centroids(mask, len(shapes))
        names = typed._names(shapes)
        for qa in (qa for qa in sc.qas if qa.qtype == typed.RELATION_QTYPE and qa.answer in ("Yes.", "No.")):
            rel, a, b = _yes_no_relation(qa.question)
            ka, kb = names.index(a), names.index(b)
            axis, sign = {"above": (1, -1), "below": (1, 1), "left": (0, -1), "right": (0, 1)}[rel]
            offset = sign * (centres[ka][axis] - centres[kb][axis])
            assert abs(offset) > typed.GAP, qa
            assert (qa.answer == "Yes.") == (offset > 0), (qa, centres[ka], centres[kb])
            seen.add((rel, qa.answer))
    assert seen == {(rel, ans) for rel in ("above", "below", "left", "right") for ans in ("Yes.", "No.")}


@pytest.mark.parametrize("size_ratio,asked", [(typed.SIZE_RATIO, False), (1.25, True)])
def test_the_size_ratio_decides_from_which_difference_the_biggest_is_asked(size_ratio, asked):
    """A triangle whose visible area is about 1.3 times a square's, far apart: the biggest and the
    smallest are asked below a ratio of 1.3 and not at the default."""
    shapes = [scenes.Shape("triangle", "red", 0.3, 0.3, 0.42), scenes.Shape("square", "blue", 0.72, 0.72, 0.26)]
    mask = scenes.label_mask(shapes)
    areas = [(mask == k + 1).sum() for k in range(2)]
    assert 1.25 < areas[0] / areas[1] < typed.SIZE_RATIO
    centres = scenes.centroids(mask, 2)
    sized = {qa.answer for seed in range(40) for qa in typed.relation_qas(shapes, centres, mask, random.Random(seed),
                                                                           size_ratio)
             if re.search(r"big|larg|huge|small|tin|littl", qa.question)}
    assert sized == ({"A triangle.", "A square."} if asked else set())
