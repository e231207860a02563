"""Compiling constraints: the budget (states, time) is a clear 400-style error naming the field, one
compile per source however many requests ask, the precompiled open-schema / json_object automata
give valid JSON, a compiling grammar holds up no other request, and compiles show in the metrics."""

import asyncio
import json
import random
import re
import threading
from concurrent.futures import Future

import httpx
import pytest
import torch
from helpers.constrained_helpers import run_decode, train_tokenizer

from vlserve import Engine
from vlserve.constrained import (CompileBudget, CompileWorkers, ConstraintCompiler, ConstraintError,
                                 ConstraintTooLarge)
from vlserve.constrained.json_automata import DATA_FILE, PRECOMPILED_SCHEMAS, precompiled
from vlserve.constrained.schema import schema_to_regex
from vlserve.constrained.vocab import token_bytes_table
from vlserve.testing.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("compile")), seed=5)


def test_over_the_state_limit_is_a_constraint_error_naming_the_field(tok):
    compiler = ConstraintCompiler(tok, budget=CompileBudget(max_states=20))
    with pytest.raises(ConstraintTooLarge, match=r"^regex is too large or too open.*over the limit of 20"):
        compiler.compile(regex="[a-z]{40}")
    with pytest.raises(ConstraintTooLarge, match=r"^json_schema \(or response_format\) is too large"):
        compiler.compile(json_schema={"type": "object", "properties": {"a_long_property_name": {"type": "string"}},
                                      "required": ["a_long_property_name"]})
    assert issubclass(ConstraintTooLarge, ConstraintError)  # an InvalidRequest: HTTP 400
    assert compiler.compile(regex="[a-z]{5}").byte_dfa.num_states <= 20


def test_a_compile_past_the_time_limit_is_stopped_and_the_worker_replaced(tok):
    workers = CompileWorkers(1, timeout_s=0.3)
    seen = []
    compiler = ConstraintCompiler(tok, workers=workers, observe=lambda s, outcome: seen.append(outcome))
    try:
        slow = schema_to_regex({})  # as a regex it is not precompiled: tens of seconds to determinise
        with pytest.raises(ConstraintTooLarge, match=r"^regex is too large or too open.*not compiled within 0.3 s"):
            compiler.compile(regex=slow)
        compiled = compiler.compile(regex="(yes|no)")  # the killed worker's successor serves the next job
        assert compiled.regex == "(yes|no)"
        assert seen == ["timeout", "ok"]
    finally:
        workers.shutdown()


def test_invalid_sources_come_back_from_the_worker_as_constraint_errors(tok):
    workers = CompileWorkers(1, timeout_s=30)
    try:
        compiler = ConstraintCompiler(tok, workers=workers)
        with pytest.raises(ConstraintError, match="invalid regex"):
            compiler.compile(regex="(unclosed")
        with pytest.raises(ConstraintError, match="requires 'a'"):
            compiler.compile(json_schema={"type": "object", "required": ["a"]})
    finally:
        workers.shutdown()


def test_a_pool_that_was_shut_down_starts_again_for_the_next_job(tok):
    workers = CompileWorkers(1, timeout_s=30)
    compiler = ConstraintCompiler(tok, workers=workers)
    assert compiler.compile(regex="a|b").regex == "a|b"
    workers.shutdown()  # a stopped engine that tests drive step by step still builds requests
    try:
        assert compiler.compile(regex="c|d").regex == "c|d"
    finally:
        workers.shutdown()


def test_requests_for_one_source_share_one_compile(tok):
    workers = CompileWorkers(2, timeout_s=30)
    compiles = []
    compiler = ConstraintCompiler(tok, workers=workers, observe=lambda s, outcome: compiles.append(outcome))
    try:
        futures = [compiler.compile_async(regex="[0-9]{3}-(red|blue)") for _ in range(4)]
        futures.append(compiler.compile_async(json_schema={"type": "string", "maxLength": 3}))
        futures.append(compiler.compile_async(json_schema='{"type": "string", "maxLength": 3}'))
        assert all(f is futures[0] for f in futures[:4])
        assert futures[4] is futures[5]  # a schema as a dict and as its json.dumps text: one source
        results = [f.result(60) for f in futures]
        assert all(r is results[0] for r in results[:4])
        assert compiles == ["ok", "ok"]
        assert compiler.compile(regex="[0-9]{3}-(red|blue)") is results[0]  # cached
        assert len(compiles) == 2
    finally:
        workers.shutdown()


def test_the_cache_keeps_at_most_its_states_evicting_the_least_recently_used(tok):
    compiler = ConstraintCompiler(tok, cache_states=30)
    first = compiler.compile(regex="[a-z]{10}")  # 11 states
    second = compiler.compile(regex="[0-9]{10}")
    assert compiler.compile(regex="[a-z]{10}") is first  # used again: now the most recent
    compiler.compile(regex="[xy]{10}")  # 33 states in all: the least recently used goes
    assert compiler.compile(regex="[a-z]{10}") is first
    assert compiler.compile(regex="[0-9]{10}") is not second


def test_the_shipped_json_automata_are_current():
    assert DATA_FILE.exists(), "run `python -m vlserve.constrained.json_automata` to build it"
    for schema in PRECOMPILED_SCHEMAS:
        found = precompiled(json.dumps(schema))
        assert found is not None, f"the precompiled automaton of {schema} is stale or missing"
        assert found[0] == schema_to_regex(schema)
    assert precompiled('{"type": "string"}') is None


def _json_minded(seed: int, tok):
    """Random tokens, but ending things (EOS, closers, short tokens) is favoured so documents end."""
    rng = random.Random(seed)
    table = token_bytes_table(tok)

    def pick(text: bytes, allowed: torch.Tensor) -> int:
        ids = allowed.nonzero().view(-1).tolist()
        if tok.eos_token_id in ids:
            return tok.eos_token_id
        closers = [i for i in ids if table[i] and table[i][-1:] in (b"}", b"]", b'"') and len(table[i]) <= 2]
        return rng.choice(closers) if closers and rng.random() < 0.6 else rng.choice(ids)

    return pick


@pytest.mark.parametrize("schema, kind", [({}, object), ({"type": "object"}, dict)])
def test_open_schema_and_json_object_outputs_are_json(tok, schema, kind):
    compiler = ConstraintCompiler(tok)
    compiled = compiler.compile(json_schema=json.dumps(schema))
    assert compiler.compile(json_schema=schema) is compiled  # precompiled: pinned, shared
    kinds = set()
    for seed in range(12):
        ids, finished, _ = run_decode(compiled, _json_minded(seed, tok), jump=seed % 2 == 0, max_steps=400)
        assert finished, seed
        value = json.loads(b"".join(compiled.vocab.token_bytes[t] for t in ids).decode("utf-8"))
        assert isinstance(value, kind)
        kinds.add(type(value).__name__)
    if schema == {}:
        assert len(kinds) >= 2, kinds  # not only objects: any JSON value


def test_a_compiling_grammar_holds_up_no_other_request(model_dir):
    """The compile of request A is held on an event; B (plain) and C (the precompiled json_object
    schema) are built, run and finish meanwhile; A then finishes with output matching its regex."""
    with Engine(model_dir, max_total_tokens=2048) as engine:
        gate, submitted = threading.Event(), threading.Event()
        real_submit = engine.grammar_workers.submit

        def held_submit(job):
            out = Future()

            def later():
                gate.wait()
                real = real_submit(job)
                real.add_done_callback(lambda f: out.set_exception(f.exception()) if f.exception()
                                       else out.set_result(f.result()))
            submitted.set()
            threading.Thread(target=later, daemon=True).start()
            return out

        engine.grammar_workers.submit = held_submit
        pattern = r"(yes|no), (red|blue)\."

        async def scenario():
            a = asyncio.ensure_future(engine.async_generate(
                prompt="USER: answer ASSISTANT:", sampling_params={"regex": pattern, "max_new_tokens": 16}))
            await asyncio.get_running_loop().run_in_executor(None, submitted.wait)
            b = await engine.async_generate(prompt="USER: hi ASSISTANT:", sampling_params={"max_new_tokens": 1})
            c = await engine.async_generate(prompt="USER: json ASSISTANT:", sampling_params={
                "json_schema": json.dumps({"type": "object"}), "max_new_tokens": 64, "temperature": 0})
            assert not a.done(), "A finished before its compile was let through"
            gate.set()
            return await a, b, c

        a, b, c = asyncio.run(scenario())
        assert b["meta_info"]["completion_tokens"] == 1
        assert c["meta_info"]["finish_reason"] in ("stop", "length")
        if c["meta_info"]["finish_reason"] == "stop":
            assert isinstance(json.loads(c["text"]), dict)
        assert re.fullmatch(pattern, a["text"]), a["text"]
        assert engine.wait_idle()
        engine.scheduler.cm.check_idle_accounting()


def test_compiles_and_their_failures_are_in_the_metrics(model_dir):
    with Engine(model_dir, max_total_tokens=1024, grammar_max_states=30) as engine:
        metrics = engine.metrics
        engine.make_request(prompt="x", sampling_params={"regex": "(a|b)c"})
        engine.make_request(prompt="x", sampling_params={"regex": "(a|b)c"})  # cached: not a compile
        with pytest.raises(ConstraintTooLarge, match="^regex is too large"):
            engine.make_request(prompt="x", sampling_params={"regex": "[a-z]{50}"})
        with pytest.raises(ConstraintError, match="invalid regex"):
            engine.make_request(prompt="x", sampling_params={"regex": "(unclosed"})
        text = metrics.exposition().decode()
        model = metrics.model_name
        assert f'vlserve_grammar_compile_seconds_count{{model_name="{model}"}} 3.0' in text
        assert f'vlserve_grammar_compile_failures_total{{model_name="{model}",reason="states"}} 1.0' in text
        assert f'vlserve_grammar_compile_failures_total{{model_name="{model}",reason="invalid"}} 1.0' in text


def test_json_object_through_the_chat_route_is_a_json_object(http):
    body = {"model": http.get("/v1/models").json()["data"][0]["id"], "max_tokens": 96, "temperature": 0,
            "messages": [{"role": "user", "content": "Describe the weather as JSON."}],
            "response_format": {"type": "json_object"}}
    out = http.post("/v1/chat/completions", json=body)
    assert out.status_code == 200, out.text
    choice = out.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    metrics = http.get("/metrics").text
    assert "vlserve_grammar_compile_seconds_count" in metrics


@pytest.fixture(scope="module")
def small_budget_http():
    """A server whose grammars may have at most 20 states."""
    from helpers.server_helpers import assert_leak_free, start_server

    engine, server = start_server(grammar_max_states=20)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            yield client
        assert_leak_free(engine, server.url)
    finally:
        server.stop()
        engine.shutdown()


def _chat(http, **fields) -> httpx.Response:
    return http.post("/v1/chat/completions", json={
        "model": http.get("/v1/models").json()["data"][0]["id"], "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}], **fields})


def test_a_grammar_over_the_budget_is_a_400_naming_the_field(small_budget_http):
    out = _chat(small_budget_http, regex="[a-z]{40}")
    assert out.status_code == 400, out.text
    assert out.json()["error"]["message"].startswith("regex is too large or too open to compile")
    schema = {"type": "object", "properties": {"a_long_property_name": {"type": "string"}}}
    out = _chat(small_budget_http,
                response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert out.status_code == 400, out.text
    assert out.json()["error"]["message"].startswith("json_schema (or response_format) is too large")
    out = _chat(small_budget_http, regex="(unclosed")
    assert out.status_code == 400 and "invalid regex" in out.json()["error"]["message"]
    # the precompiled automata cost no compile: json_object is served whatever the state limit
    assert _chat(small_budget_http, response_format={"type": "json_object"}).status_code == 200
    metrics = small_budget_http.get("/metrics").text
    assert 'vlserve_grammar_compile_failures_total{model_name=' in metrics and 'reason="states"} 2.0' in metrics
