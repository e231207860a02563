"""transformers' Qwen-VL processors on a list of cases, for tests/test_preprocess_qwen_vl.py.

python qwen_vl_processor_reference.py CASES.json INPUTS.npz OUT.npz — each case names a checkpoint
folder (its processor configs), an input array of INPUTS.npz (a picture [H, W, 3] or frames
[T, H, W, 3], uint8) and the call's keyword arguments:
- "image": AutoImageProcessor → pixel_values, image_grid_thw
- "video": AutoVideoProcessor (frames given, not sampled) → pixel_values_videos, video_grid_thw
- "sample": the video processor's sample_frames for a video's metadata → the frame indices
- "chat": AutoProcessor on a chat prompt with the one video → second_per_grid_ts and the expanded text
A case transformers refuses records the error's message. Run with the reference torchvision on the
path (tests/helpers/reference_torchvision.run_reference).
"""

import json
import sys

import numpy as np
from PIL import Image
from transformers import AutoImageProcessor, AutoProcessor, AutoVideoProcessor
from transformers.video_utils import VideoMetadata

_loaded: dict = {}


def _load(kind, ckpt):
    if (kind, ckpt) not in _loaded:
        _loaded[kind, ckpt] = kind.from_pretrained(ckpt)
    return _loaded[kind, ckpt]


def _metadata(case, frames):
    m = case.get("metadata") or {}
    return VideoMetadata(total_num_frames=m.get("total_num_frames", len(frames)), fps=m.get("fps"),
                         frames_indices=m.get("frames_indices", list(range(len(frames)))))


def run(case, array) -> dict:
    kwargs = case.get("kwargs", {})
    if case["kind"] == "image":
        out = _load(AutoImageProcessor, case["ckpt"])(Image.fromarray(array), return_tensors="np", **kwargs)
        return {"pixel_values": out["pixel_values"], "grid": out["image_grid_thw"][0],
                "class": type(_load(AutoImageProcessor, case["ckpt"])).__name__}
    if case["kind"] == "sample":
        m = case["metadata"]
        metadata = VideoMetadata(total_num_frames=m["total_num_frames"], fps=m["fps"])
        return {"indices": np.asarray(_load(AutoVideoProcessor, case["ckpt"]).sample_frames(metadata, **kwargs))}
    if case["kind"] == "video":
        processor = _load(AutoVideoProcessor, case["ckpt"])
        out = processor([array], do_sample_frames=False, video_metadata=[_metadata(case, array)],
                        return_tensors="np", **{"cap_pixels_per_frame": False, **kwargs})
        return {"pixel_values": out["pixel_values_videos"], "grid": out["video_grid_thw"][0],
                "class": type(processor).__name__}
    processor = _load(AutoProcessor, case["ckpt"])
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = processor(text=[text], videos=[array], video_metadata=[_metadata(case, array)], do_sample_frames=False,
                    return_tensors="np", videos_kwargs={"cap_pixels_per_frame": False})
    seconds = out.get("second_per_grid_ts")
    return {"pixel_values": out["pixel_values_videos"], "grid": out["video_grid_thw"][0],
            "input_ids": out["input_ids"][0], "seconds": np.asarray([] if seconds is None else seconds, np.float64),
            "expanded": processor.tokenizer.decode(out["input_ids"][0])}


def main(cases_path: str, inputs_path: str, out_path: str) -> None:
    cases = json.load(open(cases_path))
    inputs = np.load(inputs_path)
    results = {}
    for i, case in enumerate(cases):
        try:
            got = run(case, inputs[case["array"]] if "array" in case else None)
        except ValueError as e:
            got = {"error": str(e)}
        for key, value in got.items():
            results[f"{i}/{key}"] = np.asarray(value)
    np.savez(out_path, **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
