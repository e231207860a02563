"""Every error leaves the server in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

Bad input (InvalidRequest, MediaError, ConstraintError, a failed validation, malformed JSON) is a
400 naming the problem; a full waiting queue (EngineBusy) is a 503 with Retry-After.
"""

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from vlserve.core.errors import EngineBusy, InvalidRequest, MediaError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "server_busy", 504: "timeout"}


class APIError(Exception):
    """Raised by route code for an HTTP error with a message that names the problem."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def raise_if_failed(result: dict) -> None:
    """A finished request that ended in an error: its own status (500, 503 shutting down, 504 timeout)."""
    if result.get("error"):
        raise APIError(result.get("error_status", 500), result["error"])


def error_event(chunk: dict) -> dict:
    """The error a stream sends as its last event."""
    return error_body(chunk.get("error_status", 500), chunk["error"])


def error_from_exception(e: BaseException) -> APIError:
    """The HTTP error for an exception from the engine or the media path (also used mid-stream)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, EngineBusy):
        return APIError(503, f"server busy: {e}; retry later", code="server_busy")
    if isinstance(e, (InvalidRequest, MediaError)):  # ConstraintError is an InvalidRequest
        return APIError(400, str(e), param=getattr(e, "param", None), code=type(e).__name__)
    log.exception("internal error", exc_info=e)
    return APIError(500, f"internal error: {type(e).__name__}: {e}")


async def send_json_error(send, status: int, message: str, code: str, headers: list | None = None) -> None:
    """An OpenAI-shaped JSON error sent from raw ASGI (middleware runs outside FastAPI's handlers)."""
    body = json.dumps(error_body(status, message, code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class ErrorMappingRoute(APIRoute):
    """Turns any exception of a route into an APIError inside the app. Starlette hands a bare
    Exception to its outermost middleware, which answers 500 but then re-raises, so uvicorn drops
    the (keep-alive) connection; mapped here, the answer is a normal response."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def mapped(request):
            try:
                return await handler(request)
            except (HTTPException, RequestValidationError):
                raise
            except Exception as e:
                raise error_from_exception(e) from e

        return mapped


def install_error_handlers(app: FastAPI) -> None:
    async def on_error(request: Request, e: Exception) -> JSONResponse:
        err = error_from_exception(e)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if err.status == 503 else None
        return error_response(err.status, err.message, err.param, err.code, headers)

    async def on_http(request: Request, e: HTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail), headers=getattr(e, "headers", None))

    async def on_validation(request: Request, e: RequestValidationError) -> JSONResponse:
        return _validation_response(e)

    for kind in (APIError, EngineBusy, InvalidRequest, MediaError):
        app.add_exception_handler(kind, on_error)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(Exception, on_error)


def _validation_response(e: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 as a 400 whose message names each field and what is wrong with it."""
    problems, params = [], []
    for err in e.errors():
        if err.get("type") == "json_invalid":
            problems.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})")
            continue
        loc = err.get("loc", ())
        param = ".".join(str(p) for i, p in enumerate(loc) if not _is_loc_noise(p, loc[i - 1] if i else None)) or None
        problem = f"{param or 'body'}: {err.get('msg', 'invalid')}"
        if problem not in problems:
            problems.append(problem)
            params.append(param)
    return error_response(400, "; ".join(problems) or "invalid request", next(filter(None, params), None),
                          "invalid_request")


# the values of the request models' discriminators (a message's role, a content part's type), which
# pydantic puts in an error's location after the list index: messages.0.user.content
_UNION_TAGS = ("system", "developer", "user", "assistant", "text", "image_url", "video_url")


def _is_loc_noise(part, before) -> bool:
    """Where the field came from ("body"), pydantic's union-branch tags ("str", "list[int]") and a
    discriminator's value right after a list index ("user" in messages.0.user.content)."""
    return part in ("body", "query", "path", "header", "form", "str", "int", "float", "bool", "dict") or (
        isinstance(part, str) and "[" in part) or (isinstance(before, int) and part in _UNION_TAGS)
