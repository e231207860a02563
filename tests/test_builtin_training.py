"""The built-in model's training-only attention targets point at the right patches, words and frames,
and the supervision loss measures attention mass on them."""

import math
import random

import pytest
import torch
from transformers import AutoTokenizer

from vlserve.builtin import scenes
from vlserve.builtin.attention_targets import (
    KEYWORD_LAYER, RETRIEVAL_HEADS, RETRIEVAL_LAYER, AttentionBatch, object_patches, retrieval_patches,
)
from vlserve.builtin.train import BatchMaker, build_image_processor
from vlserve.model.builtin import BUILTIN_MODEL_DIR

GRID = 4


@pytest.fixture(scope="module")
def maker():
    tok = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    return BatchMaker(tok, build_image_processor(), seed=0, grid=GRID)


def _multi_object_scene(seed=0, at_least=3):
    rng = random.Random(seed)
    while True:
        scene = scenes.image_scene(rng)
        if len(scene.objects[0]) >= at_least:
            return scene


def _patch_of(scene, maker, positions):
    """Image-token positions (first turn) back to patch indices."""
    ids, _, _, _ = maker.encode(scene, scene.qas[:1])
    image_positions = [i for i, t in enumerate(ids) if t == maker.image_token_id]
    return sorted(image_positions.index(p) for p in positions)


def test_every_object_owns_patches_and_no_patch_has_two_owners():
    for seed in range(20):
        scene = _multi_object_scene(seed, at_least=2)
        per_object = object_patches(scene, GRID)[0]
        assert all(per_object), "an object without patches"
        for k, patches in enumerate(per_object):
            # the mask really has object k+1 in each of its patches
            block = scenes.CANVAS // GRID
            for p in patches:
                r, c = divmod(p, GRID)
                assert (scene.masks[0][r * block:(r + 1) * block, c * block:(c + 1) * block] == k + 1).any()
        # shapes sit in distinct quadrants, so their patch sets are disjoint
        flat = [p for ps in per_object for p in ps]
        assert len(flat) == len(set(flat))


def test_named_shape_question_targets_that_shape_and_its_keywords(maker):
    scene = _multi_object_scene(1)
    patches = object_patches(scene, GRID)[0]
    for qa in [q for q in scene.qas if q.about is not None]:
        ids, _, spans, targets = maker.encode(scene, [qa])
        retrieval = [t for t in targets if t.layer == RETRIEVAL_LAYER]
        assert sorted(t.head for t in retrieval) == sorted(RETRIEVAL_HEADS)
        for t in retrieval:
            assert t.query == spans[0][1] - 1, "supervised where the first answer token is predicted"
            assert _patch_of(scene, maker, t.keys) == sorted(patches[qa.about])
        words = [t for t in targets if t.layer == KEYWORD_LAYER]
        if words:
            text = maker.tok.decode([ids[k] for k in words[0].keys]).lower()
            named = scene.objects[0][qa.about]
            assert named.shape in text or named.colour in text, (qa.question, text)


def test_caption_words_target_the_shape_being_described(maker):
    scene = _multi_object_scene(2)
    caption = next(q for q in scene.qas if q.qtype == "caption")
    ids, _, _, targets = maker.encode(scene, [caption])
    patches = object_patches(scene, GRID)[0]
    for t in targets:
        next_word = maker.tok.decode([ids[t.query + 1]]).strip().lower()
        owner = next(k for k, ps in enumerate(patches) if _patch_of(scene, maker, t.keys) == sorted(ps))
        obj = scene.objects[0][owner]
        assert next_word in (obj.colour, obj.shape, "a", "an"), (next_word, obj)
    described = {tuple(sorted(t.keys)) for t in targets}
    assert len(described) == len(scene.objects[0]), "every shape in the caption is looked at"


def test_video_targets_pick_frames_by_question(maker):
    rng = random.Random(3)
    move = scenes.video_scene(rng, 6, kind="move")
    direction = next(q for q in move.qas if q.qtype == "direction")
    first, last = retrieval_patches(move, direction, GRID)
    n = GRID * GRID
    assert first and all(i // n == 0 for i in first), "head A: the first frame"
    assert last and all(i // n == 5 for i in last), "head B: the last frame"

    recolour = scenes.video_scene(rng, 6, kind="recolour")
    colours = [objs[0].colour for objs in recolour.objects]
    for qtype, want in (("first_colour", colours[0]), ("last_colour", colours[-1])):
        qa = next(q for q in recolour.qas if q.qtype == qtype)
        a, b = retrieval_patches(recolour, qa, GRID)
        assert a == b
        assert {colours[i // n] for i in a} == {want}


def test_counting_has_no_retrieval_target():
    scene = _multi_object_scene(4)
    count = next(q for q in scene.qas if q.qtype == "count")
    assert retrieval_patches(scene, count, GRID) is None


def test_attention_loss_is_minus_log_mass_on_the_keys(maker):
    scene = _multi_object_scene(5)
    batch = maker.make([scene], max_turns=2)
    att = batch.attention
    n_entries, T = att.keys.shape
    assert n_entries > 0
    uniform = torch.full((1, 6, T, T), 1.0 / T)
    expected = sum(-math.log(float(k.sum()) / T) for k in att.keys) / n_entries
    loss = att.loss({RETRIEVAL_LAYER: uniform, KEYWORD_LAYER: uniform})
    assert loss.item() == pytest.approx(expected, rel=1e-5)

    # all mass on the first key of every supervised (row, head, query): loss ~ 0
    focused = {layer: torch.zeros(1, 6, T, T) for layer in (RETRIEVAL_LAYER, KEYWORD_LAYER)}
    for i in range(n_entries):
        key = int(att.keys[i].nonzero()[0])
        focused[int(att.layer[i])][att.row[i], att.head[i], att.query[i], key] = 1.0
    assert att.loss(focused).item() == pytest.approx(0.0, abs=1e-5)


def test_empty_attention_batch_has_zero_loss():
    empty = AttentionBatch.build([[]], T=8)
    assert empty.loss({RETRIEVAL_LAYER: torch.rand(1, 6, 8, 8)}).item() == 0.0


def test_turn_priority_only_changes_which_questions(maker):
    scene = scenes.video_scene(random.Random(6), 4, kind="move")
    picked = maker.pick_turns(scene.qas, 2, priority=True)
    assert len(picked) == 2 and all(q in scene.qas for q in picked)
    assert len({id(q) for q in maker.pick_turns(scene.qas, 9, priority=False)}) == len(scene.qas)


def test_video_kind_is_checked():
    with pytest.raises(ValueError, match="kind"):
        scenes.video_scene(random.Random(0), 4, kind="spin")
