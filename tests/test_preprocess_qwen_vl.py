"""preprocess/qwen_vl*.py against transformers' Qwen-VL processors, which AutoProcessor builds from the
tiny checkpoints' configs (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): pixels, grids, token counts, seconds
per grid and timestamps identical, for pictures of many sizes and aspect ratios (panoramas, below
min_pixels, above max_pixels) under several min/max_pixels, and videos of odd and even lengths.
transformers runs in one process with the reference torchvision (tests/helpers/reference_torchvision.py)."""

import json

import numpy as np
import pytest
from PIL import Image

from helpers.reference_torchvision import run_reference
from vlserve.preprocess.errors import MediaError
from vlserve.preprocess.qwen_vl import QwenVLProcessing
from vlserve.preprocess.qwen_vl_video import QwenVLVideoProcessing, timestamp_text
from vlserve.testing.tiny_qwen_vl import QWEN_ARCHS, TinyQwenVLSpec, make_tiny_qwen_vl, processor_configs

# the tests comparing with transformers share one reference run: about 15 s on two cores
shares_reference_run = pytest.mark.slow
MODEL_TYPES = {"qwen2-vl": "qwen2_vl", "qwen2.5-vl": "qwen2_5_vl", "qwen3-vl": "qwen3_vl"}
# (height, width): odd sizes, both orientations, panoramas, below min_pixels, above max_pixels
IMAGE_SIZES = [(50, 90), (90, 50), (129, 257), (37, 1000), (1000, 37), (5, 7), (20, 20), (1200, 1700)]
# (min_pixels, max_pixels) per request; None: the checkpoint's own
PIXEL_BOUNDS = [None, (28 * 28 * 16, 28 * 28 * 32), (56 * 56, 56 * 56), (100, 28 * 28 * 400)]
# frames, height, width: one frame, a pair, odd and even counts, a tiny clip
VIDEO_SHAPES = [(1, 40, 60), (2, 40, 60), (5, 50, 90), (8, 36, 100), (9, 120, 160), (4, 20, 20)]


def picture(height, width, seed):
    """Noise over a gradient: every resize path has detail to get wrong."""
    rs = np.random.RandomState(seed)
    ramp = np.linspace(0, 200, width)[None, :, None] + np.linspace(0, 55, height)[:, None, None]
    return np.clip(ramp + rs.randint(-40, 40, (height, width, 3)), 0, 255).astype(np.uint8)


def clip(frames, height, width, seed):
    return np.stack([picture(height, width, seed * 100 + i) for i in range(frames)])


def _size_kwargs(bounds):
    return {} if bounds is None else {"size": {"shortest_edge": bounds[0], "longest_edge": bounds[1]}}


def _cases(ckpts):
    cases, inputs = [], {}
    for arch, ckpt in ckpts.items():
        for i, (h, w) in enumerate(IMAGE_SIZES):
            inputs[f"image{i}"] = picture(h, w, i)
            for bounds in PIXEL_BOUNDS if arch != "qwen2.5-vl" else [None]:  # 2.5's image processor is 2's
                cases.append({"kind": "image", "arch": arch, "ckpt": ckpt, "array": f"image{i}", "bounds": bounds,
                              "kwargs": _size_kwargs(bounds)})
        for i, shape in enumerate(VIDEO_SHAPES):
            inputs[f"video{i}"] = clip(*shape, seed=i)
            for bounds, cap in ((None, False), ((28 * 28 * 8, 28 * 28 * 24), False), (None, True)):
                kwargs = {**_size_kwargs(bounds), "cap_pixels_per_frame": cap}
                cases.append({"kind": "video", "arch": arch, "ckpt": ckpt, "array": f"video{i}", "bounds": bounds,
                              "cap": cap, "kwargs": kwargs})
        # a 5-frame sample of a 30 fps, 15-frame clip; a 4-frame one at 10 fps
        for array, metadata in (("video2", {"fps": 30.0, "total_num_frames": 15, "frames_indices": [0, 3, 7, 10, 14]}),
                                ("video5", {"fps": 10.0, "total_num_frames": 4, "frames_indices": [0, 1, 2, 3]})):
            cases.append({"kind": "chat", "arch": arch, "ckpt": ckpt, "array": array, "metadata": metadata})
        for total, source_fps in ((15, 30.0), (100, 24.0), (301, 7.5)):
            for num_frames, fps in ((None, None), (8, None), (7, None), (None, 1.0), (None, 2.5), (None, 0.1)):
                if (num_frames is not None and num_frames > total) or (arch != "qwen3-vl" and num_frames == fps):
                    continue  # Qwen2's sample_frames needs one of them (its processor samples nothing by default)
                cases.append({"kind": "sample", "arch": arch, "ckpt": ckpt,
                              "metadata": {"total_num_frames": total, "fps": source_fps},
                              "kwargs": {"num_frames": num_frames, "fps": fps}})
    # transparency composited onto white, gray to RGB, as transformers' convert_to_rgb does
    alpha = np.random.RandomState(8).randint(0, 256, (45, 61, 1), dtype=np.uint8)
    inputs["rgba"], inputs["gray"] = np.concatenate([picture(45, 61, 8), alpha], axis=2), picture(45, 61, 9)[..., 0]
    for array in ("rgba", "gray"):
        cases.append({"kind": "image", "arch": "qwen3-vl", "ckpt": ckpts["qwen3-vl"], "array": array, "bounds": None})
    inputs["panorama"] = picture(2, 500, 7)  # 250:1, past the 200:1 both refuse
    cases.append({"kind": "image", "arch": "qwen2-vl", "ckpt": ckpts["qwen2-vl"], "array": "panorama",
                  "bounds": None})
    return cases, inputs


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(cases, inputs, transformers' results by case)."""
    root = tmp_path_factory.mktemp("qwen-processors")
    ckpts = {arch: make_tiny_qwen_vl(str(root / arch), arch) for arch in QWEN_ARCHS}
    cases, inputs = _cases(ckpts)
    (root / "cases.json").write_text(json.dumps(cases))
    np.savez(root / "inputs.npz", **inputs)
    run_reference("qwen_vl_processor_reference.py", str(root / "cases.json"), str(root / "inputs.npz"),
                  str(root / "out.npz"))
    out = np.load(root / "out.npz")
    results = [{k.split("/", 1)[1]: out[k] for k in out.files if k.split("/", 1)[0] == str(i)}
               for i in range(len(cases))]
    return cases, inputs, results, ckpts


def _image_processing(arch, bounds):
    config = processor_configs(QWEN_ARCHS[arch], TinyQwenVLSpec())["preprocessor_config.json"]
    processing = QwenVLProcessing.from_hf_config(config)
    return processing if bounds is None else processing.with_pixels(*bounds)


def _video_processing(arch, bounds, cap=False):
    files = processor_configs(QWEN_ARCHS[arch], TinyQwenVLSpec())
    config = files.get("video_preprocessor_config.json", files["preprocessor_config.json"])
    processing = QwenVLVideoProcessing.from_hf_config(MODEL_TYPES[arch], {**config, "cap_pixels_per_frame": cap})
    return processing if bounds is None else processing.with_pixels(*bounds)


def _frames(array):
    return [Image.fromarray(frame) for frame in array]


@shares_reference_run
def test_pictures_identical_to_transformers(reference):
    cases, inputs, results, _ = reference
    checked = 0
    for case, ref in zip(cases, results):
        if case["kind"] != "image" or "error" in ref:
            continue
        assert str(ref["class"]) == "Qwen2VLImageProcessor"  # the torchvision backend AutoProcessor builds
        processing = _image_processing(case["arch"], case["bounds"])
        got = processing.process(Image.fromarray(inputs[case["array"]]))
        where = f"{case['arch']} {inputs[case['array']].shape} bounds={case['bounds']}"
        assert got.grid_thw == tuple(ref["grid"]), where
        assert got.pixel_values.dtype == np.float32 and got.pixel_values.flags.c_contiguous
        assert got.pixel_values.shape[:3] == got.grid_thw  # the shape is the grid
        assert np.array_equal(got.rows, ref["pixel_values"]), where
        height, width = inputs[case["array"]].shape[:2]
        assert got.num_tokens == processing.num_tokens(height, width) == int(np.prod(ref["grid"])) // 4, where
        checked += 1
    assert checked == 8 * 4 * 2 + 8 + 2


@shares_reference_run
def test_too_wide_a_picture_is_refused_by_both(reference):
    cases, inputs, results, _ = reference
    (ref,) = [r for c, r in zip(cases, results) if c.get("array") == "panorama"]
    assert "aspect ratio" in str(ref["error"])
    with pytest.raises(MediaError, match="aspect ratio"):
        _image_processing("qwen2-vl", None).process(Image.fromarray(inputs["panorama"]))


@shares_reference_run
def test_videos_identical_to_transformers(reference):
    cases, inputs, results, _ = reference
    checked = refused = 0
    for case, ref in zip(cases, results):
        if case["kind"] != "video":
            continue
        processing = _video_processing(case["arch"], case["bounds"], case["cap"])
        frames = inputs[case["array"]]
        where = f"{case['arch']} {frames.shape} bounds={case['bounds']} cap={case['cap']}"
        if "error" in ref:  # Qwen3-VL refuses a one-frame video
            assert case["arch"] == "qwen3-vl" and len(frames) == 1, (where, ref["error"])
            with pytest.raises(MediaError, match="at least 2 frames"):
                processing.process_video(_frames(frames))
            refused += 1
            continue
        got = processing.process_video(_frames(frames))
        assert got.grid_thw == tuple(ref["grid"]), where
        assert got.grid_thw[0] == (len(frames) + 1) // 2  # pairs, an odd count padded
        assert np.array_equal(got.pixel_values, ref["pixel_values"]), where
        assert got.num_tokens == processing.num_tokens(*frames.shape[:3]) == int(np.prod(ref["grid"])) // 4
        checked += 1
    assert checked == 3 * 6 * 3 - 3 and refused == 3


@shares_reference_run
def test_seconds_per_grid_and_timestamps_identical_to_transformers(reference):
    cases, inputs, results, ckpts = reference
    from transformers import AutoTokenizer

    for case, ref in zip(cases, results):
        if case["kind"] != "chat":
            continue
        m = case["metadata"]
        got = _video_processing(case["arch"], None).process_video(
            _frames(inputs[case["array"]]), m["frames_indices"], m["fps"], m["total_num_frames"])
        assert np.array_equal(got.pixel_values, ref["pixel_values"]) and got.grid_thw == tuple(ref["grid"])
        tokenizer = AutoTokenizer.from_pretrained(ckpts[case["arch"]])
        video_pad = tokenizer.convert_tokens_to_ids("<|video_pad|>")
        assert list(ref["input_ids"]).count(video_pad) == got.num_tokens
        if case["arch"] == "qwen2.5-vl":
            assert [got.second_per_grid_t] == list(ref["seconds"])
        else:
            assert got.second_per_grid_t is None and len(ref["seconds"]) == 0
        if case["arch"] == "qwen3-vl":
            pad = "<|video_pad|>" * got.tokens_per_patch
            expected = "".join(f"{timestamp_text(t)}<|vision_start|>{pad}<|vision_end|>" for t in got.timestamps)
            assert expected in str(ref["expanded"])
        else:
            assert got.timestamps is None


@shares_reference_run
def test_frame_sampling_identical_to_transformers(reference):
    cases, _, results, _ = reference
    compared = 0
    for case, ref in zip(cases, results):
        if case["kind"] != "sample":
            continue
        m, kwargs = case["metadata"], case["kwargs"]
        processing = _video_processing(case["arch"], None)
        if "error" in ref:
            with pytest.raises(MediaError):
                processing.sample_indices(m["total_num_frames"], m["fps"], **kwargs)
            continue
        got = processing.sample_indices(m["total_num_frames"], m["fps"], **kwargs)
        assert got == ref["indices"].tolist(), (case["arch"], m, kwargs)
        compared += 1
    assert compared >= 3 * 15
    # Qwen2-VL and Qwen2.5-VL sample nothing unless asked: every frame, as do_sample_frames=False
    assert _video_processing("qwen2-vl", None).sample_indices(15, 30.0) == list(range(15))


def test_request_bounds_are_checked():
    processing = _image_processing("qwen2-vl", None)
    with pytest.raises(MediaError, match="min_pixels"):
        processing.with_pixels(min_pixels=5000, max_pixels=4000)
    with pytest.raises(MediaError, match="max_pixels must be a positive integer"):
        processing.with_pixels(max_pixels=-1)
    assert processing.with_pixels(max_pixels=28 * 28 * 4).num_tokens(1000, 1000) == 4
    # mm_processor_kwargs: the names vLLM and transformers take
    assert processing.with_processor_kwargs({"max_pixels": 28 * 28 * 4}).max_pixels == 28 * 28 * 4
    assert processing.with_processor_kwargs({"size": {"shortest_edge": 100, "longest_edge": 9000}}).min_pixels == 100
    with pytest.raises(MediaError, match=r"\['fps_typo'\] are not taken"):
        processing.with_processor_kwargs({"fps_typo": 2})
    with pytest.raises(MediaError, match="size must be"):
        processing.with_processor_kwargs({"size": {"height": 10}})
    video = _video_processing("qwen3-vl", None).with_processor_kwargs({"min_pixels": 32 * 32 * 2})
    assert video.frames.min_pixels == 32 * 32 * 2 and video.model_type == "qwen3_vl"


def test_picture_keys_cover_pixels_and_grid():
    processing = _image_processing("qwen2-vl", None)
    a = processing.process(Image.fromarray(picture(50, 90, 0)))
    assert processing.process(Image.fromarray(picture(50, 90, 0))).content_hash == a.content_hash
    assert processing.process(Image.fromarray(picture(50, 90, 1))).content_hash != a.content_hash
    from vlserve.preprocess.qwen_vl_keys import image_key
    t, h, w = a.grid_thw
    assert image_key(a.pixel_values.reshape(t, w, h, -1)) != a.content_hash  # same patches, transposed grid


def test_video_keys_go_per_frame_pair():
    processing = _video_processing("qwen2-vl", None)
    base = clip(12, 40, 60, seed=3)
    other = np.concatenate([base[:8], clip(4, 40, 60, seed=4)])
    a, b = processing.process_video(_frames(base)), processing.process_video(_frames(other))
    # the same first 8 frames: the same 4 pairs' keys; then they part
    assert a.patch_keys[:4] == b.patch_keys[:4] and a.patch_keys[4] != b.patch_keys[4]
    # a clip extended by new frames keeps its old pairs' keys
    grown = processing.process_video(_frames(np.concatenate([base, clip(2, 40, 60, seed=5)])))
    assert grown.patch_keys[:6] == a.patch_keys
    # a still picture never shares a pair's key, even where the pixels are the same
    still = _image_processing("qwen2-vl", (processing.frames.min_pixels, processing.frames.max_pixels))
    doubled = processing.process_video(_frames(np.stack([base[0], base[0]])))
    picture_item = still.process(Image.fromarray(base[0]))
    assert np.array_equal(picture_item.pixel_values, doubled.patches[0].pixel_values)
    assert picture_item.content_hash not in doubled.patch_keys
    assert {p.role for p in doubled.patches} == {"video_patch"} and picture_item.role == "image"


def test_qwen2_5_video_keys_carry_seconds_per_pair():
    processing = _video_processing("qwen2.5-vl", None)
    frames = _frames(clip(4, 40, 60, seed=6))
    slow = processing.process_video(frames, [0, 1, 2, 3], 2.0, 4)
    fast = processing.process_video(frames, [0, 1, 2, 3], 8.0, 4)
    assert slow.second_per_grid_t == 1.0 and fast.second_per_grid_t == 0.25
    assert np.array_equal(slow.pixel_values, fast.pixel_values)
    assert not set(slow.patch_keys) & set(fast.patch_keys)  # other temporal positions, other KV


def test_a_decoded_video_carries_its_times_into_the_processing():
    """read_video's frames and VideoInfo: Qwen3-VL's pair timestamps and Qwen2.5-VL's seconds per pair
    come from the frames' indices in the 10 fps source."""
    from test_preprocess_video import encode_video, gray_frames
    from vlserve.preprocess import read_video
    from vlserve.preprocess.qwen_vl_video import process_sampled_video

    sampled = read_video(encode_video(gray_frames(12)), num_frames=4)  # frames 0, 4, 7, 11
    qwen3 = process_sampled_video(_video_processing("qwen3-vl", None), sampled)
    assert qwen3.timestamps == pytest.approx([0.2, 0.9])  # (0 + 0.4) / 2, (0.7 + 1.1) / 2
    qwen2_5 = process_sampled_video(_video_processing("qwen2.5-vl", None), sampled)
    assert qwen2_5.second_per_grid_t == pytest.approx(2 / (4 / 12 * 10))
    assert qwen2_5.grid_thw[0] == 2
