"""Do decoding requests keep producing tokens while a 256-frame video is encoded?

    python benchmarks/video_encode_itl.py
    python benchmarks/video_encode_itl.py --configs "default:" \
        "budget:--chunked-prefill-size 256 --max-num-encoder-input-tokens 128"

For each server configuration: STREAMS chat requests decode (ignore_eos) and their inter-token
latency (gaps between content chunks, client side) is measured twice — alone, and while one request
with a 256-frame video (num_frames 256, 16 vision tokens a frame: 4,096 of them) is decoded, resized,
hashed, encoded by the tower and prefilled, from its submission to its answer. Reported: ITL p50 /
p99 in both phases and p99 during / p99 alone (the issue's bar: under 3x), and whether anything
failed. The server runs with --video-max-frames 256. Writes benchmarks/results/video_encode_itl.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from media_servers import (MEDIA_SPEC, lossless_clip, media_model, percentile, run, served_name,  # noqa: E402
                           start_vlserve, timed_chat, video_uri)
from vlserve.bench.report import provenance, write_report  # noqa: E402

FRAMES = 256
SPEC = MEDIA_SPEC.__class__(**{**MEDIA_SPEC.__dict__, "image_size": 56})  # 16 tokens a frame


def stream_body(model: str, i: int, tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": f"Tell me a long story, number {i}."}],
            "max_tokens": tokens, "temperature": 0, "ignore_eos": True}


def video_body(model: str, clip: bytes) -> dict:
    return {"model": model, "max_tokens": 1, "media_io_kwargs": {"video": {"num_frames": FRAMES}},
            "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video_uri(clip)}},
                                                      {"type": "text", "text": "What happens?"}]}]}


def gaps_within(times: list[float], start: float, end: float) -> list[float]:
    return [b - a for a, b in zip(times, times[1:]) if start <= a and b <= end]


async def phase(url: str, model: str, streams: int, tokens: int, clip: bytes | None) -> dict:
    """The streams' gaps inside the window: while the video request runs, or (no clip) the middle of
    the streams' life, of similar length."""
    async with httpx.AsyncClient(timeout=1200) as client:
        tasks = [asyncio.create_task(timed_chat(client, url, stream_body(model, i, tokens))) for i in range(streams)]
        await asyncio.sleep(3)  # the streams are decoding
        start = time.monotonic()
        video = None
        if clip is not None:
            video = await timed_chat(client, url, video_body(model, clip))
        else:
            await asyncio.sleep(10)
        end = time.monotonic()
        done = await asyncio.gather(*tasks)
    gaps = [g for d in done for g in gaps_within(d.token_times, start, end)]
    if clip is not None and any(len(d.token_times) < tokens - 1 for d in done):
        raise RuntimeError("a stream ended early")
    return {"gaps": gaps, "window_s": end - start, "video": video}


def measure(model: str, flags: str, args) -> dict:
    server = start_vlserve(model, args.threads, "--video-max-frames", str(FRAMES), "--max-total-tokens", "16384",
                           *shlex.split(flags))
    try:
        name = served_name(server)
        clip = lossless_clip(_frames(), 8)
        run(phase(server.url, name, args.streams, 40, None))  # warm-up
        alone = run(phase(server.url, name, args.streams, args.tokens, None))
        during = run(phase(server.url, name, args.streams, args.tokens, clip))
        health = httpx.get(server.url + "/health", timeout=10).status_code
    finally:
        server.stop()
    return {"alone": alone, "during": during, "health": health}


def _frames() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, 255, (SPEC.image_size, SPEC.image_size, 3), dtype=np.uint8) for _ in range(FRAMES)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["default:", "budget:--chunked-prefill-size 256 "
                                                                "--max-num-encoder-input-tokens 128"])
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--tokens", type=int, default=600)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/video_encode_itl.md")
    args = p.parse_args()
    model = media_model(SPEC, "media-bench-56")
    rows = []
    for config in args.configs:
        label, _, flags = config.partition(":")
        m = measure(model, flags, args)
        alone, during = m["alone"]["gaps"], m["during"]["gaps"]
        video = m["during"]["video"]
        rows.append(f"| {label} | `{flags or '(defaults)'}` | {percentile(alone, 50) * 1000:.1f} | "
                    f"{percentile(alone, 99) * 1000:.1f} | {percentile(during, 50) * 1000:.1f} | "
                    f"{percentile(during, 99) * 1000:.1f} | {percentile(during, 99) / percentile(alone, 99):.2f}x | "
                    f"{m['during']['window_s']:.1f} | {video.prompt_tokens} | {len(during)} | {m['health']} |")
    text = "\n".join([
        "# Decoding while a 256-frame video is encoded", "", provenance(), "",
        f"{args.streams} streamed chat requests decode ({args.tokens} tokens, ignore_eos) on a random LLaVA "
        "(decoder 512 x 6 layers, CLIP 56 px: 16 tokens a frame); one request then sends a 256-frame video "
        "(lossless, 56x56, num_frames 256: 4,096 vision tokens) and max_tokens 1. ITL = gaps between a stream's "
        "content chunks, client side, inside the window (the video request's life; alone: 10 s of the streams "
        "alone). One run; the machine is shared with six other sessions, so the ratio is within one run.", "",
        "| config | flags | ITL p50 alone ms | p99 alone ms | p50 during ms | p99 during ms | p99 during / alone | "
        "video request s | video prompt tokens | gaps during | /health after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows, ""])
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
