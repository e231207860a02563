"""Schemathesis over every route of a real `vlserve serve` (the built-in model), read from the
server's own /openapi.json: no 5xx, no response the schema does not describe (status, content type,
body, headers), and afterwards the server is healthy with no KV in use.

Two runs: Schemathesis's default generation (valid and invalid inputs) and its positive mode (only
schema-valid inputs, which get past validation into the engine: the run checks that some did).
A fixed seed and a bounded number of examples; benchmarks/fuzz_schemathesis.py runs the same with
other seeds and more examples through VLSERVE_FUZZ_SEED / VLSERVE_FUZZ_EXAMPLES.
"""

import os
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_headers_conformance,
                                               response_schema_conformance, status_code_conformance)

from helpers.server_helpers import assert_server_leak_free, serve_builtin, stop_process
from vlserve.server.app import build_app
from vlserve.server.args import ServerArgs

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("VLSERVE_FUZZ_SEED", "20261204"))
MAX_EXAMPLES = int(os.environ.get("VLSERVE_FUZZ_EXAMPLES", "12"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
# requests that reached the engine: a 200 from a route that generates
ENGINE_ROUTES = {"/generate", "/upload", "/v1/chat/completions", "/v1/completions"}
calls: Counter = Counter()  # (mode, path) → cases sent
reached_engine: Counter = Counter()  # (mode, path) → cases answered 200 by a generating route


@pytest.fixture(scope="module")
def served_url():
    # a short context keeps every generated request cheap; the timeouts bound any that is not (generated
    # regexes and JSON schemas compile for real: within 2 s or a 400 saying the grammar is too large)
    proc, url = serve_builtin("--context-length", "96", "--max-total-tokens", "4096", "--request-timeout", "60",
                               "--grammar-compile-timeout", "2")
    try:
        yield url
        assert_server_leak_free(url)
        _assert_positive_cases_reached_the_engine()
    finally:
        stop_process(proc)


def _schema(modes: list) -> object:
    """The document every server serves at /openapi.json (test_served_schema_is_this_one checks the
    running one is the same). Loaded at import: Schemathesis's lazy from_fixture loader does not run
    under pytest 9."""
    schema = schemathesis.openapi.from_dict(build_app(None, ServerArgs()).openapi())
    schema.config.seed = SEED
    # no example database: each run is the seed's alone, not failures replayed from earlier runs
    schema.config.generation.update(modes=modes, max_examples=MAX_EXAMPLES, database="none")
    return schema


FUZZ_SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                         suppress_health_check=list(HealthCheck))


def _call(case, url: str, mode: str) -> None:
    response = case.call(base_url=url, timeout=90)
    case.validate_response(response, checks=CHECKS)
    calls[mode, case.path] += 1
    if response.status_code == 200 and case.path in ENGINE_ROUTES:
        reached_engine[mode, case.path] += 1


def _assert_positive_cases_reached_the_engine() -> None:
    """Valid requests must get past validation into the engine on the OpenAI routes, or the positive
    run tested only the validation. Checked once the module's tests ran (they run in random order)."""
    openai_routes = ("/v1/chat/completions", "/v1/completions")
    if any(calls["positive", path] for path in openai_routes):
        assert sum(reached_engine["positive", path] for path in openai_routes) > 0, (calls, reached_engine)


@_schema(list(schemathesis.GenerationMode)).parametrize()
@FUZZ_SETTINGS
def test_default_generation(case, served_url):
    _call(case, served_url, "default")


@_schema([schemathesis.GenerationMode.POSITIVE]).parametrize()
@FUZZ_SETTINGS
def test_positive_generation(case, served_url):
    _call(case, served_url, "positive")


def test_served_schema_is_this_one(served_url):
    served = httpx.get(served_url + "/openapi.json", timeout=10).json()
    assert served == build_app(None, ServerArgs()).openapi()


def test_served_schema_documents_the_real_errors(served_url):
    schema = httpx.get(served_url + "/openapi.json", timeout=10).json()
    ids = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            ids.append(operation["operationId"])
            assert "422" not in operation["responses"], (method, path)
    assert len(ids) == len(set(ids)), ids
    chat = schema["paths"]["/v1/chat/completions"]["post"]["responses"]
    for status in ("400", "401", "404", "413", "429", "503"):
        assert chat[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert set(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    for method in ("get", "post"):
        assert set(schema["paths"]["/flush_cache"][method]["responses"]["200"]["content"]) == {"text/plain"}
    assert schema["components"]["schemas"]["UserMessage"]["required"] == ["role", "content"]
    assert "content" not in schema["components"]["schemas"]["AssistantMessage"]["required"]
