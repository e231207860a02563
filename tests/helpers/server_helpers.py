"""Shared by tests/test_server_*.py: ONE real server (uvicorn on 127.0.0.1, a free port) for the whole
session, media builders, and the leak check (invariants 1 and 7 of docs/ARCHITECTURE.md after every error)."""

import atexit
import base64
import io
import os
import re
import subprocess
import tempfile
import threading
import time

import av
import httpx
import numpy as np
from PIL import Image

from vlserve.bench.workload_defs import lossless_mkv
from vlserve.server.app import make_engine
from vlserve.server.background import BackgroundServer
from vlserve.server.args import ServerArgs

_lock = threading.RLock()
_shared: dict = {}


def tiny_model_dir() -> str:
    with _lock:
        if "model" not in _shared:
            from vlserve.testing.tiny import make_tiny_model

            _shared["model"] = make_tiny_model(tempfile.mkdtemp(prefix="vlserve-server-tests-"))
        return _shared["model"]


def served_model() -> str:
    """The name the test servers serve their model under (the model directory's name)."""
    return os.path.basename(tiny_model_dir())


def start_server(**overrides) -> tuple[object, BackgroundServer]:
    """A fresh engine and server on a free port (the caller stops both)."""
    args = ServerArgs(**{"model": tiny_model_dir(), "port": 0, "max_total_tokens": 4096, "max_running_requests": 64,
                         "num_threads": 1, **overrides})
    engine = make_engine(args)
    return engine, BackgroundServer(engine, args).start()


def shared_server() -> tuple[object, BackgroundServer]:
    """The session's one server, started on first use and stopped at exit."""
    tiny_model_dir()
    with _lock:
        if "server" not in _shared:
            engine, server = start_server()
            _shared["server"] = (engine, server)
            atexit.register(lambda: (server.stop(), engine.shutdown()))
        return _shared["server"]


# ---- media ---------------------------------------------------------------------------------------
def wait_healthy(proc, url: str, timeout: float = 600.0) -> None:
    """Until a server process started with stdout piped answers /health: fails if it exits first or
    takes longer than timeout (start-up on a loaded 2-core machine can take minutes)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError("the server exited: " + proc.stdout.read())
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not answer /health within {timeout:.0f} s")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def png(width: int = 40, height: int = 40, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def jpeg(width: int = 40, height: int = 40, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(png(width, height, seed))).save(buf, "JPEG")
    return buf.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def mp4(num_frames: int = 6, size: int = 32) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=6)
        stream.width, stream.height, stream.pix_fmt = size, size, "yuv420p"
        for i in range(num_frames):
            frame = np.full((size, size, 3), 30 * i, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def lossless_video(frames: list[np.ndarray], rate: int = 6) -> bytes:
    """A Matroska/FFV1 video of these RGB frames: lossless, so equal frames decode to equal pixels."""
    return lossless_mkv(frames, rate)


def png_bomb(width: int = 50_000, height: int = 50_000) -> bytes:
    """A valid PNG header claiming width x height pixels, with almost no data."""
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 1000)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def image_message(uri: str, text: str = "What is in the image?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                         {"type": "text", "text": text}]}]


# ---- invariants ----------------------------------------------------------------------------------
def assert_leak_free(engine, url: str | None = None, timeout: float = 30.0) -> None:
    """Once idle: nothing in use, free + cached == capacity, no locked node; the server is healthy
    and its gauges agree."""
    end = time.monotonic() + timeout
    while True:
        state = engine.pool_state()
        if engine.wait_idle(timeout=0.5) and state["in_use"] == 0 and engine.pool_state()["in_use"] == 0:
            break
        assert time.monotonic() < end, f"not idle or KV still in use after {timeout}s: {state}"
        time.sleep(0.05)
    engine.scheduler.cm.check_idle_accounting()
    if url is not None:
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        gauges = metric_values(httpx.get(url + "/metrics", timeout=10).text, "vlserve_kv_pool_tokens")
        assert gauges.get('state="in_use"') == 0, gauges


def metric_values(text: str, name: str) -> dict[str, float]:
    """{labels: value} of one metric in Prometheus text ('' for no labels). The model_name label every
    series carries is left out of the keys."""
    out = {}
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{(.*?)\}})? (\S+)$", text, re.M):
        labels = ",".join(p for p in (m.group(1) or "").split(",") if p and not p.startswith("model_name="))
        out[labels] = float(m.group(2))
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_builtin(*flags: str) -> tuple[subprocess.Popen, str]:
    """A real `vlserve serve` process on the built-in model (no --model) and a free port, once it
    answers /health; the caller stops it (stop_process). Its output goes to a file (proc.log_path):
    a pipe nobody reads fills up and blocks the server's logging."""
    import sys

    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="vlserve-serve-", suffix=".log", delete=False)
    command = [sys.executable, "-m", "vlserve", "serve", "--port", str(port), "--num-threads", "1", *flags]
    proc = subprocess.Popen(command,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log_path = log.name
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600  # start-up on a loaded 2-core machine can take minutes
    while True:
        if proc.poll() is not None:
            raise AssertionError("the server exited: " + open(log.name).read()[-4000:])
        if time.monotonic() > deadline:
            stop_process(proc)
            raise AssertionError("the server did not answer /health within 600 s")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def stop_process(proc) -> str:
    """SIGTERM, then SIGKILL after 30 s; returns the tail of what the process printed."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with open(proc.log_path) as f:
        out = f.read()
    os.unlink(proc.log_path)
    return out[-4000:]


def assert_server_leak_free(url: str, timeout: float = 60.0) -> None:
    """From outside a server process: healthy, nothing waiting or running, and no KV in use (by
    /get_server_info and by the /metrics gauge) once idle."""
    end = time.monotonic() + timeout
    while True:
        assert httpx.get(url + "/health", timeout=10).status_code == 200, "the server is unhealthy"
        state = httpx.get(url + "/get_server_info", timeout=10).json()["internal_states"][0]
        gauges = metric_values(httpx.get(url + "/metrics", timeout=10).text, "vlserve_kv_pool_tokens")
        idle = state["num_waiting_requests"] == 0 and state["num_running_requests"] == 0
        if idle and state["kv_pool_tokens"]["in_use"] == 0 and gauges.get('state="in_use"') == 0:
            return
        assert time.monotonic() < end, f"not idle or KV still in use after {timeout:.0f} s: {state}, {gauges}"
        time.sleep(0.2)
