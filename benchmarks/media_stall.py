"""Does media work stall the engine loop? Decode speed of one long stream, alone and while large
images arrive through the HTTP server.

    python benchmarks/media_stall.py                      # 32 JPEG 2000x2000 via chat data URIs
    python benchmarks/media_stall.py --format png --route upload --images 32 --size 2000

The server runs in its own process (`vlserve serve`, as in production: uvicorn's event loop, the
engine loop thread and the media pool in one process); this process is the clients. A random LLaVA
with a wider decoder makes each decode step take a few ms. Phases, each with a fresh greedy stream
(/generate, ignore_eos) whose token arrival times are recorded client side:

  alone    the stream by itself;
  small    while N requests with 32x32 images arrive (the same prefill work for the engine, no media cost);
  large    while N requests with SIZE x SIZE images arrive (decode, resize, hash, base64, JSON).

tokens/s is measured over the window in which the image requests are in flight (alone: the same
number of tokens after the same warm-up). ratio = large / alone; large / small isolates the media
path from the extra prefill work. A ratio well under 1 means media work holds the GIL or the event
loop. Writes benchmarks/results/media_stall.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import io
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np
from PIL import Image

WARMUP_TOKENS = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(out_dir: str, hidden: int, layers: int) -> str:
    from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

    spec = TinyModelSpec(hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers, num_heads=8,
                         num_kv_heads=4, max_position_embeddings=4096)
    return make_tiny_model(out_dir, spec=spec)


def encode_image(size: int, seed: int, fmt: str) -> bytes:
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    base = (ramp[None, :, None] * rng.uniform(0.3, 1.0, 3)[None, None, :] + ramp[:, None, None] * 0.2) % 256
    noise = rng.integers(0, 24, (size, size, 3), dtype=np.uint8)
    pixels = (base.astype(np.uint8) + noise).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt.upper(), **({"quality": 90} if fmt == "jpeg" else {"compress_level": 1}))
    return buf.getvalue()


def image_request(client: httpx.AsyncClient, data: bytes, fmt: str, route: str, i: int):
    if route == "upload":
        return client.post("/upload", files={"image": (f"img{i}.{fmt}", data, f"image/{fmt}")},
                           data={"prompt": f"Describe picture {i}.", "max_new_tokens": "1"})
    uri = f"data:image/{fmt};base64,{base64.b64encode(data).decode()}"
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                                      {"type": "text", "text": f"Describe picture {i}."}]}],
            "max_tokens": 1}
    return client.post("/v1/chat/completions", content=json.dumps(body), headers={"content-type": "application/json"})


async def long_stream(client: httpx.AsyncClient, times: list[float], started: asyncio.Event, stop: asyncio.Event,
                      max_tokens: int) -> None:
    body = {"text": "USER: Tell me a long story. ASSISTANT:", "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    async with client.stream("POST", "/generate", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
                if len(times) == WARMUP_TOKENS:
                    started.set()
                if stop.is_set():
                    return  # closing aborts the request


def tokens_per_s(times: list[float], start: float, end: float) -> float:
    inside = [t for t in times if start <= t <= end]
    return (len(inside) - 1) / (inside[-1] - inside[0]) if len(inside) > 1 else float("nan")


async def phase(url: str, images: list[bytes] | None, fmt: str, route: str, window_tokens: int,
                max_tokens: int) -> dict:
    times: list[float] = []
    started, stop = asyncio.Event(), asyncio.Event()
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        stream = asyncio.create_task(long_stream(client, times, started, stop, max_tokens))
        await started.wait()
        t0 = time.perf_counter()
        if images:
            responses = await asyncio.gather(*(image_request(client, d, fmt, route, i) for i, d in enumerate(images)))
            bad = [r.text[:200] for r in responses if r.status_code != 200]
            assert not bad, bad
        else:
            while len(times) < WARMUP_TOKENS + window_tokens and not stream.done():
                await asyncio.sleep(0.01)
        t1 = time.perf_counter()
        stop.set()
        await stream
    return {"tokens_per_s": tokens_per_s(times, t0, t1), "window_s": t1 - t0,
            "tokens_in_window": sum(t0 <= t <= t1 for t in times)}


def start_server(model: str, port: int, threads: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vlserve.cli", "serve", "--model", model, "--port", str(port), "--num-threads",
           str(threads), "--max-total-tokens", "16384", "--log-level", "warning"]
    proc = subprocess.Popen(cmd)
    end = time.monotonic() + 180
    while time.monotonic() < end:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("server exited")
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--size", type=int, default=2000)
    parser.add_argument("--format", choices=["jpeg", "png"], default="jpeg")
    parser.add_argument("--route", choices=["chat", "upload"], default="chat")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the server")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "media_stall.md"))
    args = parser.parse_args()

    model = make_model(tempfile.mkdtemp(prefix="media-stall-"), args.hidden, args.layers)
    large = [encode_image(args.size, i, args.format) for i in range(args.images)]
    small = [encode_image(32, 1000 + i, args.format) for i in range(args.images)]
    port = free_port()
    server = start_server(model, port, args.threads)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(phase(url, None, args.format, args.route, 20, 200))  # warm-up
        runs: dict[str, list[dict]] = {"alone": [], "small": [], "large": []}
        for _ in range(args.repeats):
            for name, imgs in (("alone", None), ("small", small), ("large", large)):
                window = runs["large"][-1]["tokens_in_window"] if name == "alone" and runs["large"] else 200
                runs[name].append(asyncio.run(phase(url, imgs, args.format, args.route, max(window, 50), 3500)))
                print(name, runs[name][-1], flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    report = summarize(runs, args, large)
    print(report)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(report)
    return 0


def summarize(runs: dict[str, list[dict]], args, large: list[bytes]) -> str:
    med = {k: float(np.median([r["tokens_per_s"] for r in v])) for k, v in runs.items()}
    window = float(np.median([r["window_s"] for r in runs["large"]]))
    mb = sum(map(len, large)) / 2**20
    lines = [
        "# Media stall: decode speed while large images arrive",
        "",
        f"- command: `python {' '.join(shlex.quote(a) for a in sys.argv)}`",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.node()} ({platform.platform()}), {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}",
        f"- model: random LLaVA, decoder hidden {args.hidden} x {args.layers} layers; "
        f"server torch threads {args.threads}",
        f"- load: {args.images} {args.format.upper()} images of {args.size}x{args.size} ({mb:.1f} MiB in all) via "
        f"{'/upload multipart' if args.route == 'upload' else '/v1/chat/completions data URIs'}, all at once; "
        f"median of {args.repeats} runs",
        "",
        "| phase | decode tokens/s of the long stream |",
        "| --- | --- |",
        f"| alone | {med['alone']:.1f} |",
        f"| while {args.images} 32x32 images arrive (same prefill work) | {med['small']:.1f} |",
        f"| while {args.images} {args.size}x{args.size} images arrive ({window:.2f} s window) | {med['large']:.1f} |",
        "",
        f"**ratio large / alone = {med['large'] / med['alone']:.2f}**; "
        f"large / small = {med['large'] / med['small']:.2f}",
        "",
        "Per run: " + json.dumps(runs),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
