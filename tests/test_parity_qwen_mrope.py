"""M-RoPE positions (model/mrope.py) against transformers' get_rope_index on many prompt layouts,
for Qwen2-VL, Qwen2.5-VL (seconds-scaled video positions) and Qwen3-VL (a video as one run per
frame pair), and the generated tokens' positions after them as transformers' generate() places
them (core/positions.py)."""

import random
from types import SimpleNamespace

import pytest
import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

from vlserve.model.mrope import VisionRun, mrope_positions, video_time_interval

MERGE = 2
TOKENS_PER_SECOND = 2
TEXT, IMAGE, VIDEO = 0, 1, 2


def _reference(model_cls, token_types, image_grids, video_grids, seconds=None):
    """transformers' positions and delta for one prompt given by its token types."""
    me = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(
        spatial_merge_size=MERGE, tokens_per_second=TOKENS_PER_SECOND)))
    me.get_vision_position_ids = lambda *a, **k: model_cls.get_vision_position_ids(me, *a, **k)
    types = torch.tensor([token_types])
    kwargs = {"image_grid_thw": torch.tensor(image_grids) if image_grids else None,
              "video_grid_thw": torch.tensor(video_grids) if video_grids else None}
    if seconds is not None:
        kwargs["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
    positions, delta = model_cls.get_rope_index(me, torch.zeros_like(types), mm_token_type_ids=types, **kwargs)
    return positions[:, 0]


def _layout(rng: random.Random, n_media: int, allow_video: bool):
    """A random prompt: text runs (>= 1 token between media, as vision start/end always are) and
    media with random grids. Returns (token types, image grids, video grids, runs without intervals)."""
    types, images, videos, runs = [TEXT] * rng.randint(0, 5), [], [], []
    for _ in range(n_media):
        video = allow_video and rng.random() < 0.5
        t = rng.choice([1, 2, 3, 7, 12]) if video else 1
        grid = (t, MERGE * rng.randint(1, 5), MERGE * rng.randint(1, 5))
        (videos if video else images).append(grid)
        runs.append((len(types), grid, video))
        types += [VIDEO if video else IMAGE] * (t * grid[1] * grid[2] // MERGE ** 2)
        types += [TEXT] * rng.randint(1, 4)
    types += [TEXT] * rng.randint(0, 3)
    return types, images, videos, runs


@pytest.mark.parametrize("seed", range(40))
def test_qwen2_vl_positions_equal_transformers(seed):
    rng = random.Random(seed)
    types, images, videos, runs = _layout(rng, rng.randint(1, 4), allow_video=True)
    expected = _reference(Qwen2VLModel, types, images, videos)
    got = mrope_positions(len(types), [VisionRun(s, g) for s, g, _ in runs], MERGE)
    assert torch.equal(got.prompt, expected)
    assert list(got.next_position) == (expected[:, -1] + 1).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_qwen2_5_vl_video_positions_scale_with_seconds(seed):
    rng = random.Random(seed)
    types, images, videos, runs = _layout(rng, rng.randint(1, 4), allow_video=True)
    seconds = [rng.choice([0.5, 2 / 3, 1.0, 1.5, 2.0, 0.3]) for _ in videos]
    expected = _reference(Qwen2_5_VLModel, types, images, videos, seconds)
    it = iter(seconds)
    vision = [VisionRun(s, g, video_time_interval(TOKENS_PER_SECOND, next(it)) if v else 1.0) for s, g, v in runs]
    got = mrope_positions(len(types), vision, MERGE)
    assert torch.equal(got.prompt, expected)


@pytest.mark.parametrize("seed", range(20))
def test_qwen3_vl_frame_pair_runs(seed):
    """Qwen3-VL: transformers splits each video grid into t grids of one temporal patch; here each
    frame pair is its own run (timestamps between them in the prompt)."""
    rng = random.Random(seed)
    types, images, videos, runs = _layout(rng, rng.randint(1, 3), allow_video=False)
    # a video: frame pairs each preceded by a timestamp's text tokens
    grid_hw = (MERGE * rng.randint(1, 3), MERGE * rng.randint(1, 3))
    frames = rng.randint(1, 4)
    for _ in range(frames):
        types += [TEXT] * rng.randint(2, 4)
        runs.append((len(types), (1, *grid_hw), True))
        types += [VIDEO] * (grid_hw[0] * grid_hw[1] // MERGE ** 2)
    types += [TEXT] * 2
    expected = _reference(Qwen3VLModel, types, images, [(frames, *grid_hw)])
    got = mrope_positions(len(types), [VisionRun(s, g) for s, g, _ in runs], MERGE)
    assert torch.equal(got.prompt, expected)


def test_text_after_a_long_video_follows_transformers_not_the_original_rule():
    """A video of 12 temporal patches, one merged patch each: text resumes at start + 1 (its
    spatial extent), and generated tokens go on from there (the original rule: from start + 12)."""
    types = [TEXT] * 3 + [VIDEO] * 12 + [TEXT] * 2
    got = mrope_positions(len(types), [VisionRun(3, (12, 2, 2))], MERGE)
    assert torch.equal(got.prompt, _reference(Qwen2VLModel, types, [], [(12, 2, 2)]))
    assert got.prompt[:, 15].tolist() == [4, 4, 4]
    assert got.rows(len(types), len(types) + 2).tolist() == [[6, 7]] * 3


def test_rows_straddle_prompt_and_generated_tokens():
    got = mrope_positions(10, [VisionRun(2, (1, 4, 6))], MERGE)
    whole = got.rows(0, 14)
    assert torch.equal(whole[:, :10], got.prompt)
    assert whole[:, 10:].tolist() == [[got.prompt[0, -1].item() + 1 + i for i in range(4)]] * 3
    for start, end in [(0, 3), (5, 12), (9, 11), (11, 13)]:
        assert torch.equal(got.rows(start, end), whole[:, start:end])


def test_a_prompt_ending_in_a_picture_goes_on_per_axis():
    """generate() adds one to each axis of the last position: a picture's last merged patch here."""
    got = mrope_positions(6, [VisionRun(2, (1, 4, 4))], MERGE)
    assert got.prompt[:, -1].tolist() == [2, 3, 3]
    assert got.rows(6, 8).tolist() == [[3, 4], [4, 5], [4, 5]]


def test_text_only_positions_are_indices():
    got = mrope_positions(7, [], MERGE)
    assert got.prompt.tolist() == [list(range(7))] * 3 and got.next_position == (7, 7, 7)


def test_overlapping_runs_are_refused():
    with pytest.raises(ValueError, match="overlaps"):
        mrope_positions(20, [VisionRun(0, (1, 4, 4)), VisionRun(2, (1, 4, 4))], MERGE)
    with pytest.raises(ValueError, match="past the prompt"):
        mrope_positions(3, [VisionRun(0, (1, 4, 4))], MERGE)
