"""The server on a background thread of this process (tests, benchmarks, notebooks)."""

import threading
import time

import uvicorn

from vlserve.server.app import build_app
from vlserve.server.args import ServerArgs


class BackgroundServer:
    """`with BackgroundServer(engine, args) as server: httpx.get(server.url + "/health")`.

    args.port 0 picks a free port. The engine stays the caller's to shut down."""

    def __init__(self, engine, args: ServerArgs):
        self.engine = engine
        config = uvicorn.Config(build_app(engine, args), host=args.host, port=args.port, log_level="warning",
                                lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="vlserve-http", daemon=True)

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self._thread.start()
        end = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
