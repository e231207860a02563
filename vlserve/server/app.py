"""The HTTP server: one FastAPI app around one Engine, run by uvicorn.

Threads: uvicorn's event loop (the caller's thread) parses requests and streams responses; the
engine's scheduling loop runs on its own thread; media decoding and tokenization run in the engine's
media pool (Engine.async_generate). The event loop never waits on the engine: chunks come back
through loop.call_soon_threadsafe.
"""

import logging
import os
import signal

from pathlib import Path

from fastapi import FastAPI, Response
from fastapi.responses import FileResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST

from vlserve.server.admin_routes import admin_router
from vlserve.server.auth import APIKeyMiddleware
from vlserve.server.graceful import GracefulServer
from vlserve.server.body_limit import BodyLimitMiddleware
from vlserve.server.errors import ErrorMappingRoute, error_response, install_error_handlers
from vlserve.server.generate import generate_router
from vlserve.server.openai_routes import openai_router
from vlserve.server.openapi_schema import error_responses, install_openapi_schema
from vlserve.server.upload import upload_router
from vlserve.server.args import ServerArgs

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"  # the page at / (no build step: plain HTML, CSS, JS)

def build_app(engine, args: ServerArgs) -> FastAPI:
    app = FastAPI(title="vlserve", description="Serving vision-language models", version="0.1.0")
    app.router.route_class = ErrorMappingRoute
    install_error_handlers(app)
    for router in (openai_router(engine, args.model_names()), generate_router(engine), upload_router(engine),
                   admin_router(engine, args)):
        app.include_router(router, responses=error_responses())
    install_openapi_schema(app)

    @app.get("/health", responses={503: error_responses()[503]})
    async def health():
        if not engine.is_alive():
            return error_response(503, "the engine loop is not running", code="engine_dead")
        if engine.draining:
            return error_response(503, "the server is shutting down", code="shutting_down")
        return {"status": "ok"}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/metrics", response_class=PlainTextResponse)  # open: no API key (server/auth.py)
    async def metrics() -> Response:
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    # Middleware added last runs first: the API key is checked before the body is counted or read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=args.max_request_bytes)
    if args.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=args.api_key)
    return app


def make_engine(args: ServerArgs):
    from vlserve.engine.engine import Engine

    return Engine(**args.engine_kwargs())


def run_server(args: ServerArgs, engine_factory=make_engine) -> int:
    """Serves until a signal; `engine_factory(args)` builds the engine (a test wraps make_engine)."""
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.node_rank > 0:  # another machine's tensor-parallel ranks: no engine, no HTTP
        from vlserve.distributed.launcher import run_worker_node
        return run_worker_node(args.tp_size, args.nnodes, args.node_rank, args.dist_init_addr, args.device)
    engine = engine_factory(args)
    # a dead tensor-parallel rank stops the server as a signal would (drain, exit), with exit status 1
    engine.on_fatal = lambda why: os.kill(os.getpid(), signal.SIGTERM)
    log.info("serving %s on http://%s:%d (dtype %s)", args.model_name(), args.host, args.port, engine.loaded.dtype_note)
    config = uvicorn.Config(build_app(engine, args), host=args.host, port=args.port, log_level=args.log_level.lower())
    try:
        GracefulServer(config, engine, args.shutdown_timeout).run()
    finally:
        engine.shutdown()
    if engine.fatal_error:
        log.error("stopped: %s", engine.fatal_error)
        return 1
    return 0
