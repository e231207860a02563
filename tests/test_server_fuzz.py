"""Fuzz every route of the OpenAPI schema with schemathesis (valid and invalid inputs, bounded
examples): no 5xx, every error in OpenAI's shape, and afterwards the server is healthy and leak-free.

A dedicated engine with a 64-token context keeps each generated request cheap."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from server_helpers import assert_leak_free, start_server
from vlserve.server.app import build_app
from vlserve.server.args import ServerArgs

MAX_EXAMPLES = 25

schema = schemathesis.openapi.from_dict(build_app(None, ServerArgs()).openapi())
schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
                                max_examples=MAX_EXAMPLES)


@pytest.fixture(scope="module")
def fuzz_server():
    engine, server = start_server(context_length=64, max_waiting_requests=256)
    yield engine, server
    try:
        assert_leak_free(engine, server.url, timeout=60)
    finally:
        server.stop()
        engine.shutdown()


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_fuzz_no_server_errors(case, fuzz_server):
    response = case.call(base_url=fuzz_server[1].url, timeout=60)
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
