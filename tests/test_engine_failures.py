"""Requests that fail after admission, inside the engine: each ends with a named error (or its
finish reason), and leaves the pool idle and the radix tree intact; the engine keeps serving.

Bugs caught: a failed forward that leaks the slots it allocated for its step, an abort in the middle
of a chunked prefill that does not free the chunks or unlock the prefix, a constraint failure that
takes its batch-mates down, a forced tail at the end of the context writing past the request's row.
"""

import json

import pytest

from vlserve import Engine
from vlserve.testing.tiny import make_tiny_model

LONG = "USER: " + " ".join(f"word{i}" for i in range(60)) + " ASSISTANT:"
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("failures")), seed=13)


def _assert_clean(engine: Engine) -> None:
    engine.scheduler.cm.check_idle_accounting()
    engine.scheduler.cm.cache.check_integrity()
    assert engine.pool_state()["in_use"] == 0


def _stepped(model_dir, **kwargs) -> Engine:
    """An engine whose loop is stopped: the test drives engine.step()."""
    engine = Engine(model_dir, max_total_tokens=2048, **kwargs)
    engine.shutdown()
    return engine


def _submit(engine: Engine, **kwargs):
    req = engine.make_request(**kwargs)
    outputs = []
    req.sink = outputs.append
    engine.scheduler.add(req)
    return req, outputs


def test_an_exception_in_the_forward_mid_prefill_frees_the_step_and_the_engine_goes_on(model_dir):
    engine = _stepped(model_dir, chunked_prefill_size=16)
    req, outputs = _submit(engine, prompt=LONG, sampling_params=GREEDY)
    engine.step()  # first chunk computed and shared with the tree
    assert 0 < req.kv_len < len(req.input_ids)
    real_forward = engine.runner.forward

    def broken(batch):
        raise RuntimeError("kernel exploded")
    engine.runner.forward = broken
    engine.step()
    assert req.finish_reason == "error" and "kernel exploded" in outputs[-1].error and outputs[-1].finished
    _assert_clean(engine)
    engine.runner.forward = real_forward
    again, outs = _submit(engine, prompt=LONG, sampling_params=GREEDY)
    while not again.finished:
        engine.step()
    assert again.finish_reason == "length" and len(again.output_ids) == GREEDY["max_new_tokens"]
    assert again.cached_tokens >= 16  # the first chunk the failed request computed was kept
    _assert_clean(engine)


def test_abort_in_the_middle_of_a_chunked_prefill(model_dir):
    engine = _stepped(model_dir, chunked_prefill_size=16)
    req, outputs = _submit(engine, prompt=LONG, sampling_params=GREEDY)
    engine.step()
    engine.step()
    assert 16 < req.kv_len < len(req.input_ids)
    engine.abort(req.rid)
    engine.step()
    assert req.finish_reason == "abort" and outputs[-1].finished and outputs[-1].new_ids == []
    assert not engine.scheduler.running and not engine.scheduler.waiting
    _assert_clean(engine)


def test_a_constraint_failure_fails_only_its_request(model_dir, monkeypatch):
    from vlserve.constrained import ConstraintState

    engine = _stepped(model_dir)
    healthy, _ = _submit(engine, prompt="USER: hello ASSISTANT:", sampling_params=GREEDY)
    broken, outputs = _submit(engine, prompt="USER: yes or no? ASSISTANT:",
                              sampling_params={"regex": "(yes|no)( indeed)*", "max_new_tokens": 8})
    assert isinstance(broken.constraint, ConstraintState)

    def advance(token_id):
        raise RuntimeError("automaton corrupted")
    monkeypatch.setattr(broken.constraint, "advance", advance)  # this request's automaton only
    for _ in range(20):
        if healthy.finished and broken.finished:
            break
        engine.step()
    assert broken.finish_reason == "error" and "automaton corrupted" in outputs[-1].error
    assert healthy.finish_reason == "length" and len(healthy.output_ids) == GREEDY["max_new_tokens"]
    _assert_clean(engine)


def test_a_forced_tail_at_the_end_of_the_context(model_dir):
    """The request's context ends inside a long forced key: the jump makes the output longer than
    max_new_tokens, and the request ends with "length" without writing past its req_to_token row."""
    schema = {"type": "object", "properties": {"a_very_long_key_name_that_is_forced": {"type": "string"}},
              "required": ["a_very_long_key_name_that_is_forced"]}
    probe = Engine(model_dir, max_total_tokens=2048)
    prompt_len = len(probe.make_request(prompt="USER: JSON please ASSISTANT:").input_ids)
    probe.shutdown()
    with Engine(model_dir, max_total_tokens=2048, context_length=prompt_len + 4) as engine:
        out = engine.generate(prompt="USER: JSON please ASSISTANT:",
                              sampling_params={"json_schema": json.dumps(schema), "max_new_tokens": 4})
        assert out["meta_info"]["finish_reason"] == "length"
        assert out["meta_info"]["completion_tokens"] == 4  # the forced key was cut at max_new_tokens
        assert len(out["text"]) >= 4 and '{"a_very_long_key_name_that_is_forced": "'.startswith(out["text"])
        assert engine.wait_idle()
        _assert_clean(engine)
        ok = engine.generate(prompt="USER: hi", sampling_params={"max_new_tokens": 2})
        assert ok["meta_info"]["completion_tokens"] == 2
