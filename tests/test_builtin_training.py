"""The built-in model's training-only targets: attention targets point at the right patches, words and
frames, the supervision loss measures attention mass on them, per-patch targets mark each shape's
centre once, answers follow the generation prompt without a leading space, and a warm start copies
the earlier checkpoint."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from vlserve.builtin import scenes, typed
from training.builtin import count_probe
from training.builtin.attention_targets import (
    KEYWORD_LAYER, REFERENCE_HEAD, RETRIEVAL_HEADS, RETRIEVAL_LAYER, AttentionBatch, object_patches,
    retrieval_patches,
)
from training.builtin.place_targets import UNIFORM_VARIANCE, PlaceBatch, PlaceHead, PlaceTarget
from training.builtin.train import (
    IMAGE_SIZE, MASS_UNIT, AuxHead, BatchMaker, build_image_processor, build_model, checkpoint_depths, losses,
    patch_targets, picture_counts, resized_position_embedding, warm_start,
)
from vlserve.model.builtin import BUILTIN_MODEL_DIR

GRID = IMAGE_SIZE // 16  # the default model's patch grid (16-px patches)
SHIPPED_TEXT_LAYERS = checkpoint_depths(Path(BUILTIN_MODEL_DIR))[0]  # warm starts need at least its depth
SHIPPED_IMAGE_SIZE = json.loads((Path(BUILTIN_MODEL_DIR) / "config.json").read_text())["vision_config"]["image_size"]


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
    ids, _, _, _, _ = maker.encode(scene, scene.qas[:1])
    image_positions = [i for i, t in enumerate(ids) if t == maker.image_token_id]
    return sorted(image_positions.index(p) for p in positions)


def test_every_object_owns_patches_where_it_is_drawn():
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


def test_each_shape_centre_is_marked_once_with_its_shape():
    rng = random.Random(8)
    for _ in range(40):
        scene = scenes.image_scene(rng)
        centre = patch_targets(scene, GRID)[0][:, 4]
        objects = scene.objects[0]
        marked = sorted(int(c) for c in centre if c)
        # one mark per shape, of its kind, even where two centres fall in one patch
        assert marked == sorted(scenes.SHAPES.index(o.shape) + 1 for o in objects)
    for _ in range(40):  # crowded pictures, where centres share patches most
        scene = typed.typed_scene(rng, typed.PictureMix(crowded_share=1.0))
        marked = sorted(int(c) for c in patch_targets(scene, GRID)[0][:, 4] if c)
        assert marked == sorted(scenes.SHAPES.index(o.shape) + 1 for o in scene.objects[0])
    outside = scenes.outside_scene(rng)
    assert not patch_targets(outside, GRID)[..., [0, 1, 4]].any()


def _fitted(head: torch.nn.Module, loss_fn, steps: int = 300) -> tuple[float, float]:
    """Train a read-out head alone with Adam; its loss before and after."""
    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    first = loss_fn().item()
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    return first, loss.item()


def test_count_head_reads_each_pictures_counts_from_its_mean_patch():
    torch.manual_seed(0)
    rng = random.Random(5)
    pictures = [typed.typed_scene(rng, typed.PictureMix(crowded_share=0.5)) for _ in range(12)]
    targets = torch.from_numpy(np.concatenate([patch_targets(s, GRID) for s in pictures])).long()
    counts = picture_counts(targets)
    for scene, row in zip(pictures, counts.tolist()):
        kinds = [o.shape for o in scene.objects[0]]
        assert row == [len(kinds)] + [kinds.count(k) for k in scenes.SHAPES]
    assert AuxHead(8, GRID).count is None  # not made (nor drawn from the random stream) unless weighed
    aux = AuxHead(8, GRID, count_weight=1.0)
    # features whose mean carries the counts: the loss falls as the linear read-out fits them
    feats = torch.randn(len(pictures), GRID * GRID, 8) * 0.1
    feats[..., :4] += counts[:, None, :]
    first, last = _fitted(aux.count, lambda: aux.count_loss(feats, targets))
    assert last < 0.05 * first


def test_patch_masses_sum_to_the_count_and_lie_where_each_shape_is_seen():
    """The density target: each shape spreads one unit over the patches it is seen in, so a picture's
    masses sum to its number of shapes (to rounding), crowded or not, and background patches have none."""
    rng = random.Random(6)
    for crowded in (0.0, 1.0):
        for _ in range(15):
            scene = typed.typed_scene(rng, typed.PictureMix(crowded_share=crowded, crowded_counts=(4, 5, 6)))
            t = patch_targets(scene, GRID)[0]
            assert abs(t[:, 5].sum() - MASS_UNIT * len(scene.objects[0])) <= GRID * GRID
            blocks = scenes.patch_blocks(scene.masks[0], GRID)
            assert ((t[:, 5] > 0) <= (blocks > 0).any(1)).all()
    assert not patch_targets(scenes.outside_scene(rng), GRID)[..., 5].any()


def test_density_head_reads_counts_as_a_sum_of_patches():
    torch.manual_seed(0)  # the head's start and the features' noise: not whatever tests ran before left
    rng = random.Random(7)
    mix = typed.PictureMix(crowded_share=0.5, crowded_counts=(4, 5, 6))
    pictures = [typed.typed_scene(rng, mix) for _ in range(12)]
    targets = torch.from_numpy(np.concatenate([patch_targets(s, GRID) for s in pictures])).long()
    assert AuxHead(8, GRID).density is None  # not made (nor drawn from the random stream) unless weighed
    aux = AuxHead(8, GRID, density_weight=1.0)
    feats = torch.randn(len(pictures), GRID * GRID, 8) * 0.02
    feats[..., 0] += targets[..., 5].float() / MASS_UNIT  # features that carry each patch's mass
    first, last = _fitted(aux.density, lambda: aux.density_loss(feats, targets))
    assert last < 0.05 * first
    summed = aux.density(feats).squeeze(-1).sum(-1).round()
    assert summed.tolist() == [float(len(s.objects[0])) for s in pictures]


def test_named_shape_question_targets_that_shape_and_its_keywords(maker):
    scene = _multi_object_scene(1)
    patches = object_patches(scene, GRID)[0]
    for qa in [q for q in scene.qas if q.about is not None]:
        ids, _, spans, targets, _ = maker.encode(scene, [qa])
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


def test_a_relation_looks_at_its_reference_shape_below_and_beside_the_answer(maker):
    """"What is above the square?" / "is the circle left of the square?": the reference heads (layer 1,
    and layer 2 beside the retrieval heads) look at the square, the retrieval heads (layer 2) at the
    shape the answer is about."""
    rng = random.Random(3)
    relations = [(sc, qa) for sc in (typed.typed_scene(rng) for _ in range(40)) for qa in sc.qas
                 if qa.qtype == typed.RELATION_QTYPE]
    measured = [(sc, qa) for sc, qa in relations if qa.ref is not None]
    assert measured and len(measured) < len(relations), "extremes (\"the biggest\") have no reference"
    for sc, qa in measured:
        assert qa.ref != qa.about
        patches = object_patches(sc, GRID)[0]
        _, _, _, targets, _ = maker.encode(sc, [qa])
        reference = [t for t in targets if t.head == REFERENCE_HEAD]
        assert sorted(t.layer for t in reference) == [KEYWORD_LAYER, RETRIEVAL_LAYER], qa
        for t in reference:
            assert _patch_of(sc, maker, t.keys) == sorted(patches[qa.ref])
        for t in (t for t in targets if t.layer == RETRIEVAL_LAYER and t.head in RETRIEVAL_HEADS):
            assert _patch_of(sc, maker, t.keys) == sorted(patches[qa.about])
    for sc, qa in relations:
        if qa.ref is None:
            assert all(t.head != REFERENCE_HEAD for t in maker.encode(sc, [qa])[3])


def test_a_relation_from_a_named_shape_asks_for_both_places_where_the_answer_is_predicted(maker):
    """"Is the circle above the square?": the place target holds both visible centres, at the position
    that predicts the answer; an extreme ("the biggest") and a plain question have none."""
    rng = random.Random(5)
    relations = [(sc, qa) for sc in (typed.typed_scene(rng) for _ in range(40)) for qa in sc.qas
                 if qa.qtype == typed.RELATION_QTYPE]
    assert any(qa.ref is None for _, qa in relations) and any(qa.ref is not None for _, qa in relations)
    for sc, qa in relations:
        _, _, spans, _, places = maker.encode(sc, [qa])
        if qa.ref is None:
            assert places == []
            continue
        centres = scenes.centroids(sc.masks[0], len(sc.objects[0]))
        assert len(places) == 1 and places[0].query == spans[0][1] - 1
        assert places[0].places == pytest.approx((*centres[qa.about], *centres[qa.ref]))
    plain = _multi_object_scene(2)
    assert all(maker.encode(plain, [qa])[4] == [] for qa in plain.qas)


def test_place_loss_is_zero_for_the_right_places_and_one_for_a_constant_guess():
    batch = PlaceBatch.build([[], [PlaceTarget(3, (0.2, 0.3, 0.7, 0.9))]])
    hidden = torch.randn(2, 5, 8)
    head = PlaceHead(8)
    with torch.no_grad():
        head.linear.bias.copy_(torch.tensor([0.2, 0.3, 0.7, 0.9]))
    assert batch.loss(hidden, head).item() == pytest.approx(0.0, abs=1e-12)
    with torch.no_grad():
        head.linear.bias.fill_(0.5)
    expected = sum((v - 0.5) ** 2 for v in (0.2, 0.3, 0.7, 0.9)) / 4 / UNIFORM_VARIANCE
    assert batch.loss(hidden, head).item() == pytest.approx(expected, rel=1e-6)
    assert PlaceBatch.build([[], []]).loss(hidden, head).item() == 0.0


def test_training_on_places_teaches_a_tiny_model_to_read_them(maker):
    """A few steps on relation rows lower the place loss of the same batch: the gradient reaches the
    read-out and the decoder (a loss that could not move would leave it where it started)."""
    torch.manual_seed(0)
    rng = random.Random(11)
    rows = []
    while len(rows) < 6:
        sc = typed.typed_scene(rng)
        rows += [sc] if any(qa.ref is not None for qa in sc.qas) else []
    for sc in rows:  # every row asks its relations measured from a named shape
        sc.qas[:] = [qa for qa in sc.qas if qa.ref is not None]
    batch = maker.make(rows, turns=1, priority=False)
    assert len(batch.places.row) == len(rows)
    model = build_model(maker.tok, text_layers=3)
    model.set_attn_implementation("eager")
    aux, head = AuxHead(model.config.text_config.hidden_size, GRID), PlaceHead(model.config.text_config.hidden_size)
    opt = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=3e-4)
    first = None
    for _ in range(30):
        place = losses(model, aux, head, batch)[3]
        first = place.item() if first is None else first
        opt.zero_grad()
        place.backward()
        opt.step()
    assert losses(model, aux, head, batch)[3].item() < 0.25 * first


def test_caption_words_target_the_shape_being_described(maker):
    scene = _multi_object_scene(2)
    caption = next(q for q in scene.qas if q.qtype == "caption")
    ids, _, _, targets, _ = maker.encode(scene, [caption])
    patches = object_patches(scene, GRID)[0]
    groups = scenes.caption_groups(scene.objects[0], scenes.centroids(scene.masks[0], len(scene.objects[0])))
    group_patches = {(c, s): sorted({p for k in ks for p in patches[k]}) for c, s, ks in groups}
    for t in targets:
        next_word = maker.tok.decode([ids[t.query + 1]]).strip().lower()
        named = [kind for kind, ps in group_patches.items() if ps == _patch_of(scene, maker, t.keys)]
        assert named, "the keys are the patches of one kind of shape"
        assert any(next_word.rstrip("s") in (c, s, "a", "an", "two", "three", "four")
                   for c, s in named), (next_word, named)
    described = {tuple(sorted(t.keys)) for t in targets}
    assert len(described) == len(set(map(tuple, group_patches.values()))), "every kind of shape is looked at"


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


def test_counting_and_outside_pictures_look_at_every_patch_and_a_missing_shape_nowhere():
    every = list(range(GRID * GRID))
    scene = _multi_object_scene(4)
    count = next(q for q in scene.qas if q.qtype == "count")
    assert retrieval_patches(scene, count, GRID) == (every, every)
    outside = scenes.outside_scene(random.Random(4))
    assert retrieval_patches(outside, outside.qas[0], GRID) == (every, every)
    no = next(q for sc in (scenes.image_scene(random.Random(s)) for s in range(50))
              for q in sc.qas if q.qtype == "exists" and q.answer == "No.")
    assert retrieval_patches(scene, no, GRID) is None


def test_appearing_shape_targets_the_whole_first_frame_and_the_shape_last():
    scene = scenes.video_scene(random.Random(9), 5, kind="appear")
    event = next(q for q in scene.qas if q.qtype == "event")
    first, last = retrieval_patches(scene, event, GRID)
    n = GRID * GRID
    assert first == list(range(n)), "nothing to look at in the first frame but the frame"
    assert last == [4 * n + p for p in object_patches(scene, GRID)[4][0]]


def test_answers_follow_the_generation_prompt_without_a_leading_space():
    from training.builtin.tokenizer import BUILTIN_CHAT_TEMPLATE, GENERATION_PROMPT

    tok = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    tok.chat_template = BUILTIN_CHAT_TEMPLATE  # what train_tokenizer gives every checkpoint it trains
    maker = BatchMaker(tok, build_image_processor(), seed=0, grid=GRID)
    scene = _multi_object_scene(7)
    seen = set()
    for _ in range(30):
        ids, _, spans, _, _ = maker.encode(scene, scene.qas[:1])
        _, start, end = spans[0]
        prompt = maker.tok.decode(ids[:start])
        answer = maker.tok.decode(ids[start:end], skip_special_tokens=True)
        raw = not prompt.endswith(GENERATION_PROMPT)
        seen.add(raw)
        assert prompt.endswith("ASSISTANT:" if raw else GENERATION_PROMPT)
        assert answer == (" " if raw else "") + scene.qas[0].answer
    assert seen == {True, False}, "both the template's prompt and a raw one are trained"


def test_warm_start_copies_the_checkpoint():
    from transformers import LlavaForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    old = LlavaForConditionalGeneration.from_pretrained(BUILTIN_MODEL_DIR)
    new = build_model(tok, text_layers=SHIPPED_TEXT_LAYERS, image_size=SHIPPED_IMAGE_SIZE)
    warm_start(new, tok, BUILTIN_MODEL_DIR)
    old_state, new_state = old.state_dict(), new.state_dict()
    assert old_state.keys() == new_state.keys()
    for k in old_state:
        assert torch.equal(old_state[k], new_state[k]), k


def test_warm_start_at_another_image_size_resamples_the_position_table():
    from transformers import LlavaForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    old = LlavaForConditionalGeneration.from_pretrained(BUILTIN_MODEL_DIR).state_dict()
    size = 96 if SHIPPED_IMAGE_SIZE == 128 else 128
    new = build_model(tok, image_size=size, text_layers=SHIPPED_TEXT_LAYERS)
    warm_start(new, tok, BUILTIN_MODEL_DIR)
    key = "model.vision_tower.embeddings.position_embedding.weight"
    table = new.state_dict()[key]
    grid = size // 16
    assert table.shape == (1 + grid * grid, old[key].shape[1])
    assert torch.equal(table[0], old[key][0])  # the class token's row is not a place
    # the corners of the new grid sit nearer the old grid's corners than the middle does
    corner, middle = table[1], table[1 + (grid // 2) * grid + grid // 2]
    assert (corner - old[key][1]).norm() < (middle - old[key][1]).norm()
    assert all(torch.equal(new.state_dict()[k], v) for k, v in old.items() if k != key)


def test_warm_start_into_a_deeper_model_computes_what_the_checkpoint_did():
    from transformers import LlavaForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    old = LlavaForConditionalGeneration.from_pretrained(BUILTIN_MODEL_DIR).eval()
    new = build_model(tok, vision_layers=6, text_layers=SHIPPED_TEXT_LAYERS + 1, image_size=SHIPPED_IMAGE_SIZE).eval()
    warm_start(new, tok, BUILTIN_MODEL_DIR)
    assert new.config.vision_config.num_hidden_layers == 6
    assert new.config.text_config.num_hidden_layers == SHIPPED_TEXT_LAYERS + 1
    grown = new.model.vision_tower.encoder.layers[5]
    assert not grown.mlp.fc2.weight.any() and grown.mlp.fc1.weight.any()  # only the residual outputs are zero
    image_id = new.config.image_token_id
    tokens = (SHIPPED_IMAGE_SIZE // 16) ** 2
    ids = torch.tensor([[tok.bos_token_id] + [image_id] * tokens + tok("how many shapes?").input_ids])
    pixels = torch.randn(1, 3, SHIPPED_IMAGE_SIZE, SHIPPED_IMAGE_SIZE)
    with torch.no_grad():
        want = old(input_ids=ids, pixel_values=pixels).logits
        got = new(input_ids=ids, pixel_values=pixels).logits
    assert torch.allclose(got, want, atol=1e-5)
    with torch.no_grad():
        grown.mlp.fc2.weight.normal_()  # the grown layer is in the path: changing it changes the answer
        assert not torch.allclose(new(input_ids=ids, pixel_values=pixels).logits, want, atol=1e-3)


def test_position_table_resampled_to_its_own_grid_is_unchanged():
    table = torch.randn(1 + 6 * 6, 16)
    assert torch.allclose(resized_position_embedding(table, 6), table, atol=1e-6)
    ramp = torch.arange(4.0).repeat(4).reshape(16, 1)  # column index, on a 4x4 grid
    wide = resized_position_embedding(torch.cat([torch.zeros(1, 1), ramp]), 8)[1:].reshape(8, 8)
    assert torch.all(wide[:, 1:] >= wide[:, :-1])  # still rising to the right
    assert torch.allclose(wide[0], wide[7])  # and the same in every row


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


def test_a_batch_can_give_every_sequence_the_same_number_of_turns(maker):
    rng = random.Random(3)
    image_scenes = [scenes.image_scene(rng) for _ in range(6)]
    batch = maker.make(image_scenes, turns=3)
    assert [len(spans) for spans in batch.qtypes] == [3] * 6
    video = scenes.video_scene(rng, 4, kind="move")
    assert [len(s) for s in maker.make([video], turns=9).qtypes] == [len(video.qas)]


def test_question_type_overrides_change_the_answer_weight_and_the_turn_mix():
    tok = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    plain = BatchMaker(tok, build_image_processor(), seed=0, grid=GRID)
    tuned = BatchMaker(tok, build_image_processor(), seed=0, grid=GRID,
                       qtype_weight={"colour": 7.5}, turn_priority={"colour": 50.0})
    scene = _multi_object_scene(3)
    colour = [qa for qa in scene.qas if qa.qtype == "colour"][:1]
    _, w_plain, spans, _, _ = plain.encode(scene, colour)
    _, w_tuned, _, _, _ = tuned.encode(scene, colour)
    _, start, end = spans[0]
    # QTYPE_WEIGHT["colour"] is 1.0; the multi-object boost multiplies both alike
    assert {t / p for t, p in zip(w_tuned[start:end], w_plain[start:end])} == {7.5}

    def colour_first(maker):
        return sum(maker.pick_turns(scene.qas, 1, priority=True)[0].qtype == "colour" for _ in range(200))
    tuned_share, plain_share = colour_first(tuned), colour_first(plain)
    assert tuned_share > 120 and tuned_share > 2 * plain_share, (tuned_share, plain_share)


def test_override_flags_name_a_known_question_type():
    import argparse

    from training.builtin.train import QTYPE_WEIGHT, _overrides

    parser = argparse.ArgumentParser()
    assert _overrides(parser, ["position=3", "caption=4.5"], QTYPE_WEIGHT) == {"position": 3.0, "caption": 4.5}
    with pytest.raises(SystemExit):
        _overrides(parser, ["positon=3"], QTYPE_WEIGHT)
    with pytest.raises(SystemExit):
        _overrides(parser, ["position=high"], QTYPE_WEIGHT)


def test_averaging_checkpoints_weighs_each_tensor_by_its_share(tmp_path):
    from safetensors.torch import load_file, save_file

    from training.builtin.average import WEIGHTS, average

    shipped = load_file(BUILTIN_MODEL_DIR / WEIGHTS)
    zeros = tmp_path / "zeros"
    zeros.mkdir()
    save_file({k: torch.zeros_like(v) for k, v in shipped.items()}, zeros / WEIGHTS)
    average(tmp_path / "mixed", [(BUILTIN_MODEL_DIR, 0.25), (zeros, 0.75)])
    mixed = load_file(tmp_path / "mixed" / WEIGHTS)
    assert all(torch.allclose(mixed[k], 0.25 * shipped[k]) for k in shipped)
    assert (tmp_path / "mixed" / "config.json").read_text() == (BUILTIN_MODEL_DIR / "config.json").read_text()
    with pytest.raises(ValueError, match="add up"):
        average(tmp_path / "bad", [(BUILTIN_MODEL_DIR, 0.5), (zeros, 0.4)])


def test_averaging_with_a_checkpoint_at_another_image_size_resamples_its_position_table(tmp_path):
    """A checkpoint whose vision position table is for another grid joins an average with that table
    resampled to the first checkpoint's grid (as a warm start at the first's size would begin)."""
    from safetensors.torch import load_file, save_file

    from training.builtin.average import POSITION_TABLE, WEIGHTS, average

    shipped = load_file(BUILTIN_MODEL_DIR / WEIGHTS)
    grid = math.isqrt(shipped[POSITION_TABLE].shape[0] - 1)
    other = tmp_path / "other_grid"
    other.mkdir()
    table = torch.randn(1 + (grid + 2) ** 2, shipped[POSITION_TABLE].shape[1])
    save_file(shipped | {POSITION_TABLE: table}, other / WEIGHTS)
    average(tmp_path / "mixed", [(BUILTIN_MODEL_DIR, 0.5), (other, 0.5)])
    mixed = load_file(tmp_path / "mixed" / WEIGHTS)
    want = 0.5 * shipped[POSITION_TABLE] + 0.5 * resized_position_embedding(table, grid)
    assert torch.allclose(mixed[POSITION_TABLE], want, atol=1e-6)
    assert all(torch.equal(mixed[k], shipped[k]) for k in shipped if k != POSITION_TABLE)


def test_the_count_probe_asks_about_every_count_with_colours_shared_and_not():
    """count_probe.py fills every cell (count, colours shared or not) evenly, and scores each cell apart."""
    items = count_probe.draw(16, seed=3)
    cells = [(len(it.shapes), len({s.colour for s in it.shapes}) < len(it.shapes)) for it in items]
    assert sorted(cells) == sorted((n, r) for n in count_probe.COUNTS for r in (False, True) for _ in range(2))
    answers = ["Two." if it.colours_repeat else scenes.count_word(it.count) for it in items]
    report = count_probe.report(items, answers)
    assert "2/2    100.0%     0/2      0.0%" in report.splitlines()[1]
