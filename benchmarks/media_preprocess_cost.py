"""What one request's media costs to preprocess at the limits (preprocess/limits.py MediaLimits):
an image just under max_image_pixels, and a long video, whose every frame up to the last sampled
one is decoded (video_max_decoded_pixels bounds that).

    python benchmarks/media_preprocess_cost.py

Measured here, on one core: the preparation (decode, resize, normalise) of a JPEG and a PNG of
MAX_IMAGE_PIXELS - a little; a long single-keyframe mpeg4 video's decode rate in pixels/s; the time
to refuse a video over the decode budget (before any pixel is decoded) against the time its decode
would take. From the rate: how long the default budget allows, against what the limits allowed
before it (video_max_duration_s x MAX_SOURCE_FPS frames of max_image_pixels). Writes
benchmarks/results/media_preprocess_cost.md.
"""

from __future__ import annotations

import argparse
import datetime
import io
import math
import os
import platform
import time

import av
import numpy as np
from PIL import Image

from vlserve.preprocess import MediaError, MediaLimits
from vlserve.preprocess.prepare import prepare_image, prepare_video
from vlserve.preprocess.processing import ImageProcessing
from vlserve.preprocess.video import MAX_SOURCE_FPS

PROCESSING = ImageProcessing(shortest_edge=336, crop_size=(336, 336))  # LLaVA-1.5's


def image_bytes(side: int, fmt: str) -> bytes:
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    pixels = ((ramp[None, :, None] + ramp[:, None, None] * 0.3) % 256).astype(np.uint8).repeat(3, axis=2)
    pixels[::7, ::5] = 0  # edges, so neither codec compresses it to nothing
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {"compress_level": 1}))
    return buf.getvalue()


def video_bytes(seconds: int, width: int, height: int, fps: int = 30) -> bytes:
    """One keyframe (as a screen recording may have): reaching any frame decodes all before it."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size, stream.bit_rate = 10**6, 200_000
        frame = np.zeros((height, width, 3), np.uint8)
        for i in range(seconds * fps):
            frame[:, :, 0] = i % 256
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    try:
        out = fn()
    except MediaError as e:
        out = e
    return time.perf_counter() - start, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--video-seconds", type=int, default=120)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "media_preprocess_cost.md"))
    args = parser.parse_args()
    limits = MediaLimits()
    side = math.isqrt(limits.max_image_pixels)  # just under the limit
    rows = []
    for fmt in ("JPEG", "PNG"):
        data = image_bytes(side, fmt)
        seconds, _ = timed(lambda: prepare_image(data, PROCESSING, limits))
        rows.append(f"| {fmt} {side}x{side} ({side * side / 1e6:.1f} Mpx, {len(data) / 2**20:.1f} MiB) "
                    f"| {seconds:.2f} s |")
    width, height = 640, 360
    video = video_bytes(args.video_seconds, width, height)
    frames = args.video_seconds * 30
    decode_s, sampled = timed(lambda: prepare_video(video, PROCESSING, limits, num_frames=64))
    assert isinstance(sampled, list), sampled
    rate = frames * width * height / decode_s
    tight = MediaLimits(video_max_decoded_pixels=frames * width * height // 2)
    refuse_s, refused = timed(lambda: prepare_video(video, PROCESSING, tight, num_frames=64))
    assert isinstance(refused, MediaError) and "video_max_decoded_pixels" in str(refused), refused
    budget_s = limits.video_max_decoded_pixels / rate
    before_s = limits.video_max_duration_s * MAX_SOURCE_FPS * limits.max_image_pixels / rate
    rows.append(f"| video {args.video_seconds} s, {width}x{height} at 30 fps, one keyframe, 64 frames sampled "
                f"({len(video) / 2**20:.1f} MiB) | {decode_s:.2f} s ({rate / 1e6:.0f} Mpx/s decoded) |")
    rows.append(f"| the same video over a budget of half its pixels: refused | {refuse_s:.3f} s "
                f"(ratio {refuse_s / decode_s:.3f} of decoding it) |")
    text = "\n".join([
        "# Media preprocessing cost at the limits",
        "",
        "- command: `python benchmarks/media_preprocess_cost.py`",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.node()} ({platform.platform()}), {os.cpu_count()} CPUs, one thread",
        "",
        "| media (one request) | preprocessing |", "| --- | --- |", *rows, "",
        f"At {rate / 1e6:.0f} Mpx/s, the default video_max_decoded_pixels={limits.video_max_decoded_pixels:.2e} "
        f"allows at most {budget_s:.0f} s of decoding for one video; before it, the limits allowed "
        f"video_max_duration_s x {MAX_SOURCE_FPS} fps x max_image_pixels = {before_s / 3600:.0f} h "
        f"(ratio {before_s / budget_s:.0f}x). Images are bounded by max_image_pixels alone.",
        ""])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
