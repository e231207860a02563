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
from vlserve.engine.prompt import VIDEO_MARKER, tokenize_text
from vlserve.preprocess import MediaOptions, ProcessedImage, check_image_count, pad_values
from vlserve.preprocess.qwen_vl_video import QWEN3_VL

VISION_START, VISION_END, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"
IMAGE_WRAPPER = VISION_START + "<|image_pad|>" + VISION_END
VIDEO_WRAPPER = VISION_START + VIDEO_PAD + VISION_END


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
                  options: MediaOptions, scope: str = "") -> tuple[list[int], list[ImageSpan]]:
    """RequestBuilder's tokens for a Qwen-VL model: the prompt as the chat template wrote it (one
    `<|vision_start|><|image_pad|><|vision_end|>` per picture, `…<|video_pad|>…` per video; media
    without one are put first, as `<image>` markers are for LLaVA). Pictures and videos go through
    the checkpoint's QwenVLMediaProcessing (with the request's mm_processor_kwargs) and the
    processed-media cache; videos are sampled by the request's media_io_kwargs as for every family
    (else --video-frames) and made frame pairs. Qwen3-VL's videos are then written as its processor
    writes them: a `<t seconds>` text and a vision start/pad/end per frame pair."""
    cfg = builder.config
    check_image_count(len(image_data), builder.limits)
    processing = options.processing_for(builder.processing)
    image_data = [builder.media_ids.resolve(item, "image", scope, builder.limits) for item in image_data]
    video_data = [builder.media_ids.resolve(item, "video", scope, builder.limits) for item in video_data]
    images = [builder.image_cache.prepare_image(src, processing, builder.limits) for src in image_data]
    sampling = options.video.with_default(builder.video_frames)
    videos = [builder.image_cache.prepare_video(src, processing, builder.limits, sampling.num_frames, sampling.fps,
                                                sampling.max_frames) for src in video_data]
    timestamped = bool(videos) and processing.video.model_type == QWEN3_VL  # a pad per pair, after its time
    if prompt is not None:
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt must be a string")
        ids = tokenize_text(builder.tokenizer, prompt)
        missing_images = max(0, len(images) - ids.count(cfg.image_token_id))
        missing_videos = max(0, len(videos) - ids.count(cfg.video_token_id))
        # the `<video>` marker every family takes (what the chat route writes for a video part) is
        # the video's place, as the chat template places its pad
        markers = min(prompt.count(VIDEO_MARKER), missing_videos)
        text = prompt.replace(VIDEO_MARKER, VIDEO_WRAPPER, markers)
        text = IMAGE_WRAPPER * missing_images + VIDEO_WRAPPER * (missing_videos - markers) + text
        if timestamped:
            text = with_qwen3_video_text(text, videos)
        if text != prompt:
            ids = tokenize_text(builder.tokenizer, text)
    else:
        vocab = cfg.text.vocab_size
        if not (isinstance(input_ids, list) and all(isinstance(t, int) and 0 <= t < vocab for t in input_ids)):
            raise InvalidRequest(f"input_ids must be a list of token ids in [0, {vocab})")
        ids = list(input_ids)
        if timestamped:
            ids = with_qwen3_video_ids(builder.tokenizer, ids, cfg.video_token_id, videos)
    if timestamped:
        pads = [VideoPad([patch]) for video in videos for patch in video]
    else:
        pads = [VideoPad(video, video[0].second_per_grid_t) for video in videos]
    return expand_qwen_media(ids, cfg.image_token_id, cfg.video_token_id, images, pads, cfg.image_tokens)


def with_qwen3_video_text(text: str, videos: list[list[ProcessedImage]]) -> str:
    """The prompt with its k-th video's `<|vision_start|><|video_pad|><|vision_end|>` (or a bare
    `<|video_pad|>`) replaced by qwen3_video_text of that video's pair timestamps, in order, as
    transformers' Qwen3VLProcessor replaces them."""
    pieces, rest = [], text
    for video in videos:
        at = rest.find(VIDEO_PAD)
        if at < 0:
            break  # fewer pads than videos: expand_qwen_media names the mismatch
        start, end = at, at + len(VIDEO_PAD)
        if rest.startswith(VIDEO_WRAPPER, at - len(VISION_START)):
            start, end = at - len(VISION_START), end + len(VISION_END)
        pieces += [rest[:start], qwen3_video_text(_timestamps(video))]
        rest = rest[end:]
    return "".join(pieces) + rest


def with_qwen3_video_ids(tokenizer, ids: list[int], video_token_id: int, videos: list[list[ProcessedImage]]
                         ) -> list[int]:
    """with_qwen3_video_text for input_ids: each video's pad (with the vision start/end around it)
    replaced by the tokens of its timestamps' text."""
    start_id, end_id = tokenizer.convert_tokens_to_ids([VISION_START, VISION_END])
    out, pending = [], iter(videos)
    i = 0
    while i < len(ids):
        video = next(pending, None) if ids[i] == video_token_id else None
        if video is None:
            out.append(ids[i])
            i += 1
            continue
        wrapped = out[-1:] == [start_id] and ids[i + 1:i + 2] == [end_id]
        if wrapped:
            out.pop()
        out += tokenize_text(tokenizer, qwen3_video_text(_timestamps(video)))
        i += 2 if wrapped else 1
    return out


def _timestamps(video: list[ProcessedImage]) -> list[float]:
    return [patch.timestamp for patch in video]
