"""Shared by tests/test_lang_*.py: a fresh server on the built-in model, a recording endpoint, scenes."""

import os
import sys
import threading

import httpx
import pytest

from helpers.server_helpers import assert_leak_free, metric_values

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from common import scene as scene_png, video_scene as scene_video  # noqa: E402,F401 - the examples' scenes
from vlserve.lang.backend.runtime_endpoint import RuntimeEndpoint
from vlserve.server.app import make_engine
from vlserve.server.background import BackgroundServer
from vlserve.server.args import ServerArgs


def builtin_server(**overrides) -> tuple[object, BackgroundServer]:
    """A fresh engine (empty cache) serving the built-in model on 127.0.0.1, a free port."""
    args = ServerArgs(port=0, max_total_tokens=8192, num_threads=1, **overrides)
    engine = make_engine(args)
    return engine, BackgroundServer(engine, args).start()


@pytest.fixture(scope="module")
def served():
    """A test module's own server on the built-in model (engine, server); it must leak nothing."""
    engine, server = builtin_server()
    yield engine, server
    assert_leak_free(engine, server.url)
    server.stop()
    engine.shutdown()


class RecordingEndpoint(RuntimeEndpoint):
    """The real RuntimeEndpoint; every request's start and end is recorded, in order."""

    def __init__(self, url: str):
        super().__init__(url)
        self.events: list[tuple[str, int, dict, object]] = []
        self._lock = threading.Lock()

    def call(self, payload: dict):
        with self._lock:
            n = sum(1 for e in self.events if e[0] == "start")
            self.events.append(("start", n, payload, None))
        result = super().call(payload)
        with self._lock:
            self.events.append(("end", n, payload, result))
        return result

    def requests(self) -> list[tuple[int, dict, object]]:
        return [(n, p, r) for kind, n, p, r in self.events if kind == "end"]

    def position(self, kind: str, n: int) -> int:
        return next(i for i, e in enumerate(self.events) if e[0] == kind and e[1] == n)


def metric(url: str, name: str) -> float:
    return sum(metric_values(httpx.get(url + "/metrics", timeout=10).text, name).values())


class AppServer:
    """Any ASGI app on 127.0.0.1, a free port, on a background thread (the scripted OpenAI fake)."""

    def __init__(self, app, lifespan: str = "off"):
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    lifespan=lifespan))
        self._thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "AppServer":
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server did not start")
            self._thread.join(0.01)
        return self

    @property
    def url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
