"""The served /openapi.json made to say what the server does, so generated clients and fuzzers
(Schemathesis, tests/test_schemathesis.py) can work from it.

FastAPI's own document claims a 422 body the server never sends (server/errors.py answers every
error as OpenAI's {"error": {...}}, a validation failure as a 400), lists only JSON where routes
also stream server-sent events, and gives a route serving two methods one operationId. Here: every
route documents the error statuses it can answer with the real error body, 422 is gone, streaming
routes list text/event-stream beside JSON, and each operationId is unique.
"""

import warnings

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

ERROR_DESCRIPTIONS = {
    400: "Bad input: the message names the field and the problem (param names the field where one is to blame)",
    401: "Missing or wrong API key (only when the server runs with --api-key)",
    404: "Unknown model, route or resource",
    413: "The request body is over --max-request-bytes",
    429: "Too many requests queued: retry after the Retry-After header's seconds",
    500: "Internal error (a bug: none is expected from any request's values)",
    503: "The server is busy or shutting down (Retry-After when busy), or its engine loop stopped",
    504: "The request ran past the server's --request-timeout",
}
STREAMING_ROUTES = {"/generate", "/upload", "/v1/chat/completions", "/v1/completions"}  # those with `stream`


# One server-sent event (before OpenAPI 3.2 a stream's `schema` describes each event): data is a
# JSON chunk, the error object that ends a failed stream, or the final [DONE].
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string", "description": "a JSON chunk, an error object, or [DONE]"},
                            "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"}}}


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error the server answers with, in OpenAI's shape."""
    error: ErrorObject


def error_responses() -> dict:
    """The `responses` entry for include_router / a route: each error status with ErrorResponse."""
    return {status: {"model": ErrorResponse, "description": text} for status, text in ERROR_DESCRIPTIONS.items()}


def install_openapi_schema(app: FastAPI) -> None:
    """app.openapi() builds the document once, then rewrites it as the module docstring says."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            with warnings.catch_warnings():  # FastAPI warns of the shared operationId truthful() renames
                warnings.simplefilter("ignore", UserWarning)
                schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                     routes=app.routes)
            app.openapi_schema = truthful(schema)
        return app.openapi_schema

    app.openapi = openapi


def truthful(schema: dict) -> dict:
    operations = [(path, method, op) for path, ops in schema.get("paths", {}).items() for method, op in ops.items()]
    ids = [op.get("operationId") for _, _, op in operations]
    for path, method, operation in operations:
        responses = operation.setdefault("responses", {})
        responses.pop("422", None)
        if path in STREAMING_ROUTES and "200" in responses:
            responses["200"].setdefault("content", {})["text/event-stream"] = {"schema": SSE_EVENT}
        if ids.count(operation.get("operationId")) > 1:  # one route serving several methods
            operation["operationId"] = f"{_without_method(operation['operationId'])}_{method}"
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    return schema


def _without_method(op_id: str) -> str:
    """FastAPI's generated id ends with the route's first method (`flush_cache_flush_cache_get`)."""
    head, _, last = op_id.rpartition("_")
    return head if last in ("get", "post", "put", "patch", "delete", "head", "options") else op_id
