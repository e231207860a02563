"""The router's HTTP front: the routes of `vlserve serve`, each passed to one worker.

/health, /metrics and /flush_cache are the router's own; every other route is forwarded with its
method, headers and body unchanged, to the worker policy.py picks (keyed routes: by the request's
radix key, keys.py; the rest: by load). Responses stream back byte for byte.

Retry: a request whose worker fails before a byte of its answer reached the client (connection
refused or reset, the worker dead, or 503 while it shuts down) is sent once more, elsewhere; the
failed worker is taken out until its /health passes. Once bytes have gone out, a failure ends the
client's stream: a retry could repeat what it already got.
"""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from vlserve.router.keys import RouteKeys
from vlserve.router.workers import NoWorker, WorkerPool
from vlserve.router.worker import Worker
from vlserve.core.errors import InvalidRequest
from vlserve.server.auth import APIKeyMiddleware, media_scope
from vlserve.server.errors import error_response

log = logging.getLogger(__name__)

ATTEMPTS = 2  # the first try and one retry elsewhere
HOP_BY_HOP = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te",
                        "trailer", "proxy-authorization", "proxy-connection"})
WORKER_HEADER = "x-vlserve-worker"  # which worker answered (the body passes unchanged)
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


class WorkerFailed(Exception):
    """The worker failed before any byte of its answer was passed on: the request may go elsewhere."""


@dataclass
class Opened:
    worker: Worker
    upstream: httpx.Response
    chunks: object  # the rest of upstream.aiter_raw()
    first: bytes


class Proxy:
    def __init__(self, pool: WorkerPool, keys: RouteKeys | None, client: httpx.AsyncClient):
        self.pool, self.keys, self.client = pool, keys, client
        self.key_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="vlserve-router-keys")

    async def forward(self, request: Request) -> Response:
        try:
            key, body = await self._route(request.url.path, await request.body(), media_scope(request))
        except InvalidRequest as e:  # a media uuid the router does not know under this API key
            return error_response(400, str(e), param=e.param)
        tried: list[Worker] = []
        while True:
            try:
                choice = self.pool.acquire(key, exclude=tuple(tried))
            except NoWorker as e:
                return error_response(503, str(e), code="no_worker", headers={"Retry-After": "1"})
            try:
                opened = await self._open(choice.worker, request, body, last=len(tried) + 1 >= ATTEMPTS)
            except WorkerFailed as e:
                self.pool.release(choice.worker)
                tried.append(choice.worker)
                if len(tried) >= ATTEMPTS:
                    return error_response(502, f"the request failed on {len(tried)} workers; last: {e}",
                                          code="worker_failed")
                self.pool.metrics.retries.labels(choice.worker.url).inc()
                continue
            headers = {k: v for k, v in opened.upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            headers[WORKER_HEADER] = opened.worker.url
            return StreamingResponse(self._relay(opened), status_code=opened.upstream.status_code, headers=headers)

    async def _route(self, path: str, body: bytes, scope: str) -> tuple[list[int] | None, bytes]:
        if self.keys is None:
            return None, body
        # decoding and hashing images is CPU work: off the event loop
        return await asyncio.get_running_loop().run_in_executor(self.key_pool, self.keys.route, path, body, scope)

    async def _open(self, worker: Worker, request: Request, body: bytes, last: bool) -> Opened:
        """Sends the request and waits for the first bytes of the answer (nothing is passed on yet).
        last: no retry is left, so a 503 goes to the client as it is."""
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        url = worker.url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        upstream = None
        try:
            upstream = await self.client.send(self.client.build_request(request.method, url, headers=headers,
                                                                        content=body), stream=True)
            if upstream.status_code == 503 and not last:  # shutting down or its queue full: another worker may take it
                raise WorkerFailed(f"{worker.url} answered 503")
            chunks = upstream.aiter_raw()
            first = await anext(chunks, b"")
            return Opened(worker, upstream, chunks, first)
        except httpx.TransportError as e:
            self.pool.fail(worker, f"{type(e).__name__}: {e}")
            if upstream is not None:
                await upstream.aclose()
            raise WorkerFailed(f"{worker.url}: {type(e).__name__}") from e
        except WorkerFailed:
            await upstream.aclose()
            raise

    async def _relay(self, opened: Opened):
        try:
            yield opened.first
            async for chunk in opened.chunks:
                yield chunk
        except httpx.TransportError as e:  # bytes already went out: the client's stream ends here
            self.pool.fail(opened.worker, f"failed mid-answer: {type(e).__name__}")
        finally:
            await opened.upstream.aclose()
            self.pool.release(opened.worker)

    async def flush_cache(self) -> Response:
        workers = self.pool.healthy()
        results = await asyncio.gather(*(self.client.post(w.url + "/flush_cache") for w in workers),
                                       return_exceptions=True)
        failed = [w.url for w, r in zip(workers, results) if isinstance(r, Exception) or r.status_code != 200]
        for w in workers:
            if w.url not in failed:
                w.tree.clear()
        if failed:
            return error_response(400, f"the cache was not flushed on {failed} (busy or failed)", code="server_busy")
        return Response("Cache flushed.\n", media_type="text/plain")


def build_router_app(pool: WorkerPool, keys: RouteKeys | None, api_key: str | list[str] | None = None) -> FastAPI:
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None), limits=httpx.Limits(max_connections=None))
        state["proxy"] = Proxy(pool, keys, client)
        await pool.check_health(client)
        health = asyncio.create_task(pool.health_loop(client))
        try:
            yield
        finally:
            health.cancel()
            await client.aclose()
            state["proxy"].key_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="vlserve router", lifespan=lifespan)

    @app.get("/health")
    async def health():
        up = len(pool.healthy())
        if not up:
            return error_response(503, "no healthy worker", code="no_worker")
        return {"status": "ok", "workers": up, "workers_total": len(pool.workers)}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(pool.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/workers")
    async def workers() -> JSONResponse:
        return JSONResponse([{"url": w.url, "healthy": w.healthy, "load": w.load, "tree_tokens": w.tree.size()}
                             for w in pool.workers])

    @app.post("/flush_cache")
    async def flush_cache() -> Response:
        return await state["proxy"].flush_cache()

    @app.api_route("/{path:path}", methods=METHODS, include_in_schema=False)
    async def forward(request: Request) -> Response:
        return await state["proxy"].forward(request)

    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    return app
