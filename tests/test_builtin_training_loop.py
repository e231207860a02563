"""The built-in model's training loop when it runs faster: batches drawn in a child process are the
ones the parent would have drawn, in order, and a step under bfloat16 autocast computes the fp32
step's losses and gives fp32 gradients to fp32 weights."""

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from vlserve.builtin import scenes, typed
from training.builtin.batch_stream import BatchStream
from training.builtin.place_targets import PlaceHead
from training.builtin.train import (
    IMAGE_SIZE, AuxHead, BatchMaker, build_image_processor, build_model, checkpoint_depths, image_or_outside, losses,
    warm_start,
)
from vlserve.model.builtin import BUILTIN_MODEL_DIR

GRID = IMAGE_SIZE // 16


def _drawer(seed: int):
    """A batch maker and the function of the step that a training run draws its batches with."""
    tok = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    maker = BatchMaker(tok, build_image_processor(), seed=seed, grid=GRID)
    rng = random.Random(seed)
    mix = typed.PictureMix(crowded_share=0.75)

    def make_batch(step: int):
        if step % 2:
            return maker.make([scenes.video_scene(rng, 4) for _ in range(2)], turns=4)
        return maker.make([image_or_outside(rng, 0.75, mix) for _ in range(3)], turns=rng.randint(1, 4))
    return make_batch


def test_a_batch_stream_gives_the_batches_the_parent_would_have_drawn_in_order():
    here, there = _drawer(5), _drawer(5)
    stream = BatchStream(there).start()
    try:
        for step in range(5):
            mine, theirs = here(step), stream.next(step)
            assert torch.equal(mine.input_ids, theirs.input_ids), step
            assert torch.equal(mine.pixel_values, theirs.pixel_values), step
            assert torch.equal(mine.patch_targets, theirs.patch_targets), step
            assert mine.qtypes == theirs.qtypes, step
        assert stream.cpu_seconds() > 0
    finally:
        stream.close()


def test_a_batch_stream_says_when_its_child_died():
    def broken(step: int):
        raise ValueError("no picture")

    stream = BatchStream(broken).start()
    try:
        with pytest.raises(RuntimeError, match="batch-drawing process died"):
            stream.next(0)
    finally:
        stream.close()


def test_bf16_autocast_step_matches_the_fp32_losses_and_keeps_fp32_weights_and_gradients():
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    model = build_model(tok, text_layers=checkpoint_depths(Path(BUILTIN_MODEL_DIR))[0])
    warm_start(model, tok, BUILTIN_MODEL_DIR)
    model.set_attn_implementation("eager")
    aux, place = AuxHead(model.config.text_config.hidden_size, GRID), PlaceHead(model.config.text_config.hidden_size)
    batch = _drawer(7)(0)
    fp32 = losses(model, aux, place, batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = losses(model, aux, place, batch)
        total = sum(bf16)
    total.backward()
    for a, b in zip(fp32, bf16):
        assert abs(a.item() - b.item()) <= 0.05 * abs(a.item()) + 0.01, (a.item(), b.item())
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, name
        assert p.grad is None or p.grad.dtype == torch.float32, name
    assert model.model.language_model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
