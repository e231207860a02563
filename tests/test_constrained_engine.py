"""Constrained decoding through the Engine: outputs match their regex / schema with jump-forward on
and off, jump-forward saves forward passes, bad constraints are clear errors, nothing leaks."""

import json
import re

import jsonschema
import pytest

from vlserve import Engine
from vlserve.constrained import ConstraintError
from vlserve.testing.tiny import make_tiny_model

SCHEMA = {
    "type": "object",
    "properties": {
        "description_of_the_picture": {"type": "string", "maxLength": 12},
        "number_of_shapes_in_the_picture": {"type": "integer"},
        "is_there_a_red_circle": {"type": "boolean"},
    },
    "required": ["description_of_the_picture", "number_of_shapes_in_the_picture", "is_there_a_red_circle"],
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("constrained")), seed=5)


def _generate(model_dir, jump: bool, **params):
    with Engine(model_dir, max_total_tokens=4096, disable_jump_forward=not jump) as engine:
        prompts = [f"USER: describe picture {i} as JSON ASSISTANT:" for i in range(3)]
        outs = engine.generate(prompt=prompts, sampling_params={"max_new_tokens": 160, **params})
        assert engine.wait_idle()
        engine.scheduler.cm.check_idle_accounting()
        passes = sum(engine.metrics.value(engine.metrics.forward_passes, mode=m) for m in ("prefill", "decode"))
        return outs, passes


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_validate_and_jump_forward_saves_passes(model_dir, temperature):
    params = {"json_schema": json.dumps(SCHEMA), "temperature": temperature, "seed": 3}
    results = {}
    for jump in (False, True):
        outs, passes = _generate(model_dir, jump, **params)
        for o in outs:
            assert o["meta_info"]["finish_reason"] == "stop", o
            jsonschema.validate(json.loads(o["text"]), SCHEMA)
        results[jump] = (outs, passes)
    tokens_off = sum(o["meta_info"]["completion_tokens"] for o in results[False][0])
    assert results[True][1] < results[False][1], "jump-forward did not save forward passes"
    assert tokens_off >= 3 * len('{"description_of_the_picture": ')  // 4  # the keys were decoded token by token


def test_regex_outputs_match_with_and_without_jump(model_dir):
    pattern = r"(yes|no), the (circle|square) is (red|green|blue)\."
    for jump in (False, True):
        outs, _ = _generate(model_dir, jump, regex=pattern, temperature=1.0, seed=1)
        for o in outs:
            assert re.fullmatch(pattern, o["text"]), o["text"]


def test_invalid_constraints_are_clear_errors(model_dir):
    with Engine(model_dir, max_total_tokens=1024) as engine:
        with pytest.raises(ConstraintError):
            engine.make_request(prompt="x", sampling_params={"regex": "(unclosed"})
        with pytest.raises(ConstraintError):
            engine.make_request(prompt="x", sampling_params={"json_schema": '{"type": "object", "required": ["a"]}'})
        with pytest.raises(ValueError, match="not both"):
            engine.make_request(prompt="x", sampling_params={"regex": "a", "json_schema": "{}"})
