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
from vlserve.engine.prompt import tokenize_text
from vlserve.preprocess import ProcessedImage, check_image_count, pad_values, read_video

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_WRAPPER = VISION_START + "<|image_pad|>" + VISION_END
VIDEO_WRAPPER = VISION_START + "<|video_pad|>" + VISION_END


@dataclass(frozen=True)
class VideoPad:
    """What one `<|video_pad|>` token stands for: temporal patches (preprocess/qwen_vl_video.py's
    QwenVLVideo.patches: role VIDEO_PATCH, pixels [1, h, w, patch], keyed by qwen_vl_keys) and the
    seconds one patch spans (Qwen2.5-VL)."""
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


def qwen_expanded(builder, prompt: str | None, input_ids: list[int] | None, image_data: list, video_data: list,
                  video_num_frames: int | None = None, video_fps: float | None = None
                  ) -> tuple[list[int], list[ImageSpan]]:
    """RequestBuilder's tokens for a Qwen-VL model: the prompt as the chat template wrote it (one
    `<|vision_start|><|image_pad|><|vision_end|>` per picture, `…<|video_pad|>…` per video; media
    without one are put first, as `<image>` markers are for LLaVA), each picture through the
    checkpoint's Qwen-VL processing, each video sampled as for the other families and made frame
    pairs by its Qwen-VL video processing."""
    cfg = builder.config
    check_image_count(len(image_data), builder.limits)
    images = [builder.image_cache.prepare_image(src, builder.processing, builder.limits) for src in image_data]
    videos = [_video_pad(builder, src, video_num_frames, video_fps) for src in video_data]
    if prompt is not None:
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt must be a string")
        ids = tokenize_text(builder.tokenizer, prompt)
        missing_images = max(0, len(images) - ids.count(cfg.image_token_id))
        missing_videos = max(0, len(videos) - ids.count(cfg.video_token_id))
        if missing_images or missing_videos:
            ids = tokenize_text(builder.tokenizer, IMAGE_WRAPPER * missing_images + VIDEO_WRAPPER * missing_videos
                                + prompt)
    else:
        vocab = cfg.text.vocab_size
        if not (isinstance(input_ids, list) and all(isinstance(t, int) and 0 <= t < vocab for t in input_ids)):
            raise InvalidRequest(f"input_ids must be a list of token ids in [0, {vocab})")
        ids = list(input_ids)
    return expand_qwen_media(ids, cfg.image_token_id, cfg.video_token_id, images, videos, cfg.image_tokens)


def _video_pad(builder, source, num_frames: int | None, fps: float | None) -> VideoPad:
    """One video as Qwen2-VL / Qwen2.5-VL take it: frames sampled as for every family (num_frames or
    fps, else the server's default count), then paired and patched with the picture settings, which
    these checkpoints' videos inherit (they publish no video_preprocessor_config.json)."""
    from vlserve.preprocess.qwen_vl_video import QwenVLVideoProcessing, process_sampled_video

    if builder.config.text.mrope_interleaved:
        raise InvalidRequest("video_data is not served for Qwen3-VL models yet: their video processor settings "
                             "(video_preprocessor_config.json) are not read; pictures are", param="video_data")
    model_type = builder.config.vision_hf_config.model_type.removesuffix("_vision")
    if fps is None or num_frames is not None:
        num_frames = num_frames or builder.video_frames
    sampled = read_video(source, builder.limits, num_frames, fps)
    video = process_sampled_video(QwenVLVideoProcessing(model_type, builder.processing), sampled)
    return VideoPad(list(video.patches), video.second_per_grid_t)
