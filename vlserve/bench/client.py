"""One way for the batch jobs and benchmarks to talk to vlserve: the in-process Engine or a server.

Both clients are blocking and thread-safe, so a caller gets concurrency from a thread pool.
`generate(jobs)` sends the jobs together (the Engine's policy orders them as one batch; the server
receives them as one /generate batch), so jobs that share a prefix — questions on one video — are
scheduled to share its KV. Times are measured on the caller's side from just before the jobs are
sent: time to first token (when the answer streams) and end-to-end latency.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only named in annotations: EngineClient imports it at call time (a server's client has no torch)
    from vlserve.engine.output import OutputAssembler


@dataclass
class Job:
    prompt: str
    images: list[bytes] = field(default_factory=list)
    videos: list[bytes] = field(default_factory=list)
    max_new_tokens: int = 32
    temperature: float = 0.0
    ignore_eos: bool = False

    def sampling_params(self) -> dict:
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                "ignore_eos": self.ignore_eos}


@dataclass
class Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None
    latency_s: float
    ttft_s: float | None = None
    error: str | None = None


class EngineClient:
    """vlserve's offline Engine, in this process."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, jobs: list[Job]) -> list[Answer]:
        # imported here: a client of a server (`vlserve videoqa --url`) starts without torch
        from vlserve.engine.output import OutputAssembler

        start = time.monotonic()
        reqs = [self.engine.make_request(prompt=j.prompt, image_data=j.images or None,
                                         video_data=j.videos or None, sampling_params=j.sampling_params())
                for j in jobs]
        trackers = [_Tracker(OutputAssembler(self.engine.tokenizer, r.sampling.stop, r.sampling.skip_special_tokens))
                    for r in reqs]
        for req, tracker in zip(reqs, trackers):
            req.sink = tracker.on_output
        self.engine.submit(reqs)
        return [t.wait(start) for t in trackers]

    def close(self) -> None:
        self.engine.shutdown()


@dataclass
class _Tracker:
    """Collects a request's outputs on the engine's loop thread; the caller detokenizes afterwards."""
    assembler: OutputAssembler
    outputs: list = field(default_factory=list)
    first_token_at: float | None = None
    done_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def on_output(self, out) -> None:
        now = time.monotonic()
        if self.first_token_at is None and out.new_ids:
            self.first_token_at = now
        self.outputs.append(out)
        if out.finished:
            self.done_at = now
            self.done.set()

    def wait(self, start: float) -> Answer:
        self.done.wait()
        chunk = self.assembler.final(self.outputs)
        meta = chunk["meta_info"]
        return Answer(chunk["text"], meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"],
                      meta["finish_reason"], self.done_at - start,
                      None if self.first_token_at is None else self.first_token_at - start, chunk.get("error"))


class HttpClient:
    """A running `vlserve serve`, through its native /generate route. Media travel as base64."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0):
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def generate(self, jobs: list[Job]) -> list[Answer]:
        """One job streams (for its time to first token); several go as one batch."""
        return [self._stream(jobs[0])] if len(jobs) == 1 else self._batch(jobs)

    def _body(self, job: Job) -> dict:
        return {"text": job.prompt, "image_data": [_b64(b) for b in job.images] or None,
                "video_data": [_b64(b) for b in job.videos] or None, "sampling_params": job.sampling_params()}

    def _batch(self, jobs: list[Job]) -> list[Answer]:
        bodies = [self._body(j) for j in jobs]
        start = time.monotonic()
        resp = self.http.post("/generate", json={
            "text": [b["text"] for b in bodies], "image_data": [b["image_data"] for b in bodies],
            "video_data": [b["video_data"] for b in bodies], "sampling_params": [b["sampling_params"] for b in bodies]})
        latency = time.monotonic() - start
        _raise_for(resp)
        return [_answer(r, latency) for r in resp.json()]

    def _stream(self, job: Job) -> Answer:
        start, first, last = time.monotonic(), None, None
        with self.http.stream("POST", "/generate", json={**self._body(job), "stream": True}) as resp:
            if resp.status_code >= 400:
                resp.read()
                _raise_for(resp)
            for line in resp.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk and "meta_info" not in chunk:
                    raise RuntimeError(f"server error: {chunk['error']}")
                if first is None and chunk.get("output_ids"):
                    first = time.monotonic()
                last = chunk
        if last is None:
            raise RuntimeError("the server's stream ended without an answer")
        answer = _answer(last, time.monotonic() - start)
        answer.ttft_s = None if first is None else first - start
        return answer

    def close(self) -> None:
        self.http.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _answer(result: dict, latency: float) -> Answer:
    meta = result["meta_info"]
    reason = meta.get("finish_reason")
    reason = reason.get("type") if isinstance(reason, dict) else reason  # /generate sends SGLang's object
    return Answer(result["text"], meta["prompt_tokens"], meta["completion_tokens"], meta.get("cached_tokens", 0),
                  reason, latency)


def _raise_for(resp) -> None:
    if resp.status_code >= 400:
        raise RuntimeError(f"server answered {resp.status_code}: {resp.text[:500]}")


def make_client(url: str | None = None, model: str | None = None, api_key: str | None = None, **engine_kwargs):
    """HttpClient for a URL, otherwise an EngineClient over `model` (default: the built-in model)."""
    if url:
        return HttpClient(url, api_key)
    from vlserve import Engine

    return EngineClient(Engine(model, **engine_kwargs))
