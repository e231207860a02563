"""Qwen-VL prompts: each `<|image_pad|>` / `<|video_pad|>` token of the chat template's
`<|vision_start|>…<|vision_end|>` expanded to its media's pseudo tokens, the spans placed, and the
request's M-RoPE positions computed from them.

A picture's pad becomes t*h*w/merge² pseudo tokens of its content hash (prompt_tokens then equals
transformers' expanded length). A video becomes one span per temporal patch (frame pair), each with
pseudo tokens of that patch's own hash: two videos, or a clip and its extension, that begin with
the same frames share those patches' keys, so the radix cache shares their KV and the vision cache
their tower work. Qwen2-VL and Qwen2.5-VL write a video as one pad (its patches follow each other);
Qwen3-VL writes each frame pair between its own vision start/end after a `<t seconds>` timestamp
(qwen3_video_text), so each of its pads is one patch.
"""

from dataclasses import dataclass

from vlserve.core.errors import InvalidRequest
from vlserve.core.request import ImageSpan
from vlserve.preprocess import ProcessedImage, pad_values

VISION_START, VISION_END, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"
VIDEO_WRAPPER = VISION_START + VIDEO_PAD + VISION_END


@dataclass(frozen=True)
class VideoPad:
    """What one `<|video_pad|>` token stands for: temporal patches (role "video", pixels [1, h, w, patch]
    each, hashed with their role, grid and seconds) and the seconds one patch spans (Qwen2.5-VL)."""
    patches: list[ProcessedImage]
    second_per_grid_t: float | None = None


def qwen3_video_text(timestamps: list[float]) -> str:
    """Qwen3-VL's text for a video of these frame-pair timestamps (seconds), as its processor writes
    it in place of the chat template's vision start/pad/end: `<t seconds>` then the pair's own
    start/pad/end, one pad per pair."""
    return "".join(f"<{t:.1f} seconds>{VIDEO_WRAPPER}" for t in timestamps)


def expand_qwen_media(ids: list[int], image_token_id: int, video_token_id: int, images: list[ProcessedImage],
                      videos: list[VideoPad], tokens) -> tuple[list[int], list[ImageSpan]]:
    """ids with one pad per picture / per VideoPad → (expanded ids, spans in prompt order).
    tokens(ProcessedImage) counts a picture's or patch's tokens (ModelConfig.image_tokens)."""
    n_img, n_vid = ids.count(image_token_id), ids.count(video_token_id)
    if n_img != len(images) or n_vid != len(videos):
        raise InvalidRequest(f"the prompt has {n_img} image and {n_vid} video pad tokens for {len(images)} "
                             f"pictures and {len(videos)} video pads")
    out, spans, pictures, pads = [], [], iter(images), iter(videos)
    for t in ids:
        if t == image_token_id:
            items, seconds = [next(pictures)], None
        elif t == video_token_id:
            pad = next(pads)
            items, seconds = pad.patches, pad.second_per_grid_t
        else:
            out.append(t)
            continue
        for item in items:
            n = tokens(item)
            spans.append(ImageSpan(len(out), n, item.content_hash, item.pixel_values, item.image_size, item.role,
                                   second_per_grid_t=seconds))
            out.extend(pad_values(item.content_hash, n))
    return out, spans
