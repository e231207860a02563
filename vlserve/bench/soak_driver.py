"""Soak and chaos: concurrent clients mixing every route and feature against a real server on a small
KV pool (so eviction and retraction happen all the time), every response checked, and the engine's
invariants checked between phases.

Scenarios (each client picks one at random, again and again): OpenAI chat with a repeated or a fresh
image, a video, n=3 choices, a stream that the client drops midway, /generate with a regex, a JSON
schema, logprobs, an explicit abort of a stream, /upload multipart, a prompt near the context length,
a malformed request (must be a 4xx JSON error), and a fixed greedy control request whose output must be
identical every time it recurs. After each phase the clients pause and, once the engine is idle:
free + cached == capacity with nothing locked, the radix tree's integrity check, the process's RSS and
open file descriptors.
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import numpy as np
from PIL import Image

CONTROL = {"text": "USER: Describe a quiet lake. ASSISTANT:",
           "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"]}
BAD_BODIES = [
    ("/generate", {"text": "a", "sampling_params": {"temperature": -1}}),
    ("/generate", {"text": "a", "image_data": "data:image/png;base64,AAAA"}),
    ("/generate", {"sampling_params": {}}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
    ("/v1/completions", {"prompt": "a", "tools": [{"type": "function"}]}),
]


@dataclass
class SoakReport:
    outcomes: Counter = field(default_factory=Counter)  # scenario:outcome → count
    failures: list[str] = field(default_factory=list)  # checks that did not hold (must stay empty)
    latencies: list[tuple[float, str, float]] = field(default_factory=list)  # (time since start, scenario, s)
    phases: list[dict] = field(default_factory=list)  # per phase: time, rss_mb, fds, pool, requests


def png(seed: int, size: int = 48) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def mp4(seed: int, frames: int = 4, size: int = 32) -> bytes:
    import av

    buf, rng = io.BytesIO(), np.random.default_rng(seed)
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width = stream.height = size
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buf.getvalue()


def uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


class Client(threading.Thread):
    def __init__(self, url: str, seed: int, soak: Soak):
        super().__init__(daemon=True, name=f"soak-client-{seed}")
        self.url, self.rng, self.soak = url, random.Random(seed), soak
        self.http = httpx.Client(base_url=url, timeout=120)

    def run(self) -> None:
        scenarios = [getattr(self, name) for name in dir(self) if name.startswith("s_")]
        while not self.soak.stop.is_set():
            self.soak.running.wait()
            scenario = self.rng.choice(scenarios)
            name, start = scenario.__name__[2:], time.monotonic()
            try:
                outcome = scenario()
            except Exception as e:  # a check that failed, or a transport error: both are findings
                outcome = "failed"
                self.soak.fail(f"{name}: {type(e).__name__}: {e}")
            self.soak.record(name, outcome, time.monotonic() - start)
        self.http.close()

    # ---- scenarios: each returns an outcome label, raises when a check fails --------------------------
    def _chat(self, content, **extra) -> dict:
        r = self.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}],
                                                         "max_tokens": 8, **extra})
        return self._ok(r)

    def _ok(self, r: httpx.Response) -> dict:
        if r.status_code == 503:  # a full queue is an answer, not a failure
            return {"busy": True}
        assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}"
        return r.json()

    def s_chat_repeated_image(self):
        out = self._chat([{"type": "image_url", "image_url": {"url": uri(png(self.rng.randrange(3)))}},
                          {"type": "text", "text": "What is it?"}])
        return "busy" if out.get("busy") else "ok"

    def s_chat_fresh_image(self):
        out = self._chat([{"type": "image_url", "image_url": {"url": uri(png(10_000 + self.rng.randrange(10**6)))}},
                          {"type": "text", "text": "Describe it."}])
        return "busy" if out.get("busy") else "ok"

    def s_chat_video(self):
        out = self._chat([{"type": "video_url", "video_url": {"url": uri(mp4(self.rng.randrange(2)), "video/mp4")}},
                          {"type": "text", "text": "What happens?"}])
        return "busy" if out.get("busy") else "ok"

    def s_chat_n3(self):
        out = self._chat("Say something.", n=3, temperature=1.0, seed=self.rng.randrange(1000))
        if out.get("busy"):
            return "busy"
        assert len(out["choices"]) == 3
        return "ok"

    def s_stream_dropped(self):
        body = {"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 200,
                "ignore_eos": True, "stream": True}
        with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code == 503:
                return "busy"
            for i, _ in enumerate(r.iter_lines()):
                if i >= self.rng.randrange(2, 12):
                    return "dropped"  # closing the connection must abort the request
        return "completed"

    def s_stream_complete(self):
        body = {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 16, "stream": True}
        with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code == 503:
                return "busy"
            lines = [line for line in r.iter_lines() if line]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        return "ok"

    def s_generate_regex(self):
        pattern = r"(yes|no), (red|green|blue)"
        out = self._ok(self.http.post("/generate", json={"text": "Answer:", "sampling_params": {
            "regex": pattern, "max_new_tokens": 16, "temperature": 1.0}}))
        if out.get("busy"):
            return "busy"
        assert re.fullmatch(pattern, out["text"]) or out["meta_info"]["finish_reason"]["type"] == "length", out["text"]
        return "ok"

    def s_generate_json(self):
        out = self._ok(self.http.post("/generate", json={"text": "JSON:", "sampling_params": {
            "json_schema": json.dumps(SCHEMA), "max_new_tokens": 48, "temperature": 1.0}}))
        if out.get("busy"):
            return "busy"
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            value = json.loads(out["text"])
            assert isinstance(value["ok"], bool) and isinstance(value["n"], int)
        return "ok"

    def s_generate_logprobs(self):
        out = self._ok(self.http.post("/generate", json={"text": "Hello", "return_logprob": True, "top_logprobs_num": 2,
                                                         "sampling_params": {"max_new_tokens": 4}}))
        if out.get("busy"):
            return "busy"
        assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])
        return "ok"

    def s_generate_abort(self):
        body = {"text": "Go on and on", "stream": True, "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}}
        with self.http.stream("POST", "/generate", json=body) as r:
            if r.status_code == 503:
                return "busy"
            next(r.iter_lines())
        return "aborted"

    def s_upload(self):
        files = {"image": ("a.png", png(self.rng.randrange(3)), "image/png")}
        out = self._ok(self.http.post("/upload", files=files, data={"prompt": "Colour?", "max_new_tokens": "4"}))
        return "busy" if out.get("busy") else "ok"

    def s_near_context(self):
        r = self.http.post("/v1/completions", json={"prompt": [40] * self.rng.randrange(1900, 2100), "max_tokens": 8})
        if r.status_code == 400:
            assert "context" in r.json()["error"]["message"] or "KV pool" in r.json()["error"]["message"], r.text
            return "refused"
        self._ok(r)
        return "ok"

    def s_bad_input(self):
        path, body = self.rng.choice(BAD_BODIES)
        r = self.http.post(path, json=body)
        assert 400 <= r.status_code < 500 and r.json()["error"]["message"], f"{path}: {r.status_code} {r.text[:200]}"
        return "refused"

    def s_control(self):
        out = self._ok(self.http.post("/generate", json=CONTROL))
        if out.get("busy"):
            return "busy"
        self.soak.check_control(out["output_ids"])
        return "ok"


class Soak:
    def __init__(self, engine, url: str, clients: int = 6, seed: int = 0):
        self.engine, self.url = engine, url
        self.report = SoakReport()
        self.stop, self.running = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._control: list[int] | None = None
        self._start = time.monotonic()
        self.clients = [Client(url, seed * 1000 + i, self) for i in range(clients)]

    def record(self, scenario: str, outcome: str, seconds: float) -> None:
        with self._lock:
            self.report.outcomes[f"{scenario}:{outcome}"] += 1
            self.report.latencies.append((time.monotonic() - self._start, scenario, seconds))

    def fail(self, message: str) -> None:
        with self._lock:
            self.report.failures.append(message)

    def check_control(self, ids: list[int]) -> None:
        with self._lock:
            if self._control is None:
                self._control = ids
            elif ids != self._control:
                self.report.failures.append(f"control request changed: {ids} != {self._control}")

    def run(self, minutes: float, phase_s: float = 30.0) -> SoakReport:
        self.running.set()
        for client in self.clients:
            client.start()
        end = time.monotonic() + minutes * 60
        while time.monotonic() < end:
            time.sleep(min(phase_s, max(0.0, end - time.monotonic())))
            self.running.clear()  # clients finish the request in hand, then wait
            time.sleep(1.0)
            self._check_invariants()
            self.running.set()
        self.stop.set()
        self.running.set()
        for client in self.clients:
            client.join(timeout=180)
            if client.is_alive():
                self.fail(f"{client.name} hung")
        self._check_invariants()
        return self.report

    def _check_invariants(self) -> None:
        if not self.engine.wait_idle(120):
            self.fail("the engine did not become idle within 120 s of the clients pausing")
            return
        cm = self.engine.scheduler.cm
        try:
            cm.check_idle_accounting()
            cm.cache.check_integrity()
        except AssertionError as e:
            self.fail(f"invariant broken: {e}")
        self.report.phases.append({"t": time.monotonic() - self._start, "rss_mb": rss_mb(), "fds": open_fds(),
                                   "pool": self.engine.pool_state(), "requests": sum(self.report.outcomes.values())})


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def ramp(url: str, steps: tuple[int, ...] = (2, 8, 32, 96), seconds: float = 5.0) -> list[dict]:
    """Overload: `n` concurrent clients for `seconds` each; throughput and the 503 share per step.
    The server must answer every request with 200 or 503 (Retry-After), and recover after."""
    rows = []
    for n in steps:
        counts, stop = Counter(), time.monotonic() + seconds

        def client():
            with httpx.Client(base_url=url, timeout=120) as http:
                while time.monotonic() < stop:
                    r = http.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 8}})
                    counts[r.status_code] += 1
                    if r.status_code == 503:
                        assert r.headers.get("retry-after"), "503 without Retry-After"
                        time.sleep(float(r.headers["retry-after"]) / 10)

        threads = [threading.Thread(target=client) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = sum(counts.values())
        rows.append({"clients": n, "requests": total, "ok_per_s": counts[200] / seconds,
                     "busy_share": counts[503] / total if total else 0.0,
                     "other": {k: v for k, v in counts.items() if k not in (200, 503)}})
    return rows
