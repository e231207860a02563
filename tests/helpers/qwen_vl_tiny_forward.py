"""Loads a Qwen-VL checkpoint with transformers' AutoProcessor and AutoModelForImageTextToText, runs
its processor and one forward on a chat prompt with a picture and a 5-frame video, and prints what
it saw as JSON, for each checkpoint named. Run by tests/helpers/reference_torchvision.run_reference
(the video processor needs torchvision)."""

import json
import sys

import numpy as np
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor
from transformers.video_utils import VideoMetadata


def forward(ckpt: str) -> dict:
    processor = AutoProcessor.from_pretrained(ckpt)
    model, info = AutoModelForImageTextToText.from_pretrained(ckpt, output_loading_info=True)
    picture = Image.fromarray(np.random.RandomState(0).randint(0, 256, (50, 90, 3), dtype=np.uint8))
    video = np.random.RandomState(1).randint(0, 256, (5, 40, 60, 3), dtype=np.uint8)
    parts = [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "What is this?"}]
    messages = [{"role": "user", "content": parts}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    metadata = VideoMetadata(total_num_frames=5, fps=10.0, frames_indices=[0, 1, 2, 3, 4])
    inputs = processor(text=[text], images=[picture], videos=[video], video_metadata=[metadata],
                       do_sample_frames=False, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1]
    return {
        "processor": type(processor).__name__, "image_processor": type(processor.image_processor).__name__,
        "video_processor": type(processor.video_processor).__name__,
        "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
        "text": text, "expanded": processor.tokenizer.decode(inputs["input_ids"][0]),
        "input_ids": inputs["input_ids"][0].tolist(),
        "image_grid_thw": inputs["image_grid_thw"].tolist(), "video_grid_thw": inputs["video_grid_thw"].tolist(),
        "second_per_grid_ts": [float(s) for s in inputs.get("second_per_grid_ts", [])],
        "vocab_rows": model.get_output_embeddings().weight.shape[0], "tokenizer_size": len(processor.tokenizer),
        "last_logits": logits.tolist()}


if __name__ == "__main__":
    print(json.dumps({ckpt: forward(ckpt) for ckpt in sys.argv[1:]}))
