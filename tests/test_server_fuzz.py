"""Numbers the engine cannot compute are refused on every route with a 400 naming the field;
numbers it can compute, however extreme, are served (the cases the fuzzer of test_schemathesis.py
found, and their neighbours). After each, the shared server is healthy and leaks nothing.

Issue 51's case: temperature 1e39 with a regex answered 500 ("probability tensor contains either
inf, nan or element < 0"): 1e39 became inf in float32, and -inf / inf on each masked token is NaN.
"""

import json

import pytest

from helpers.server_helpers import assert_leak_free

PROMPT = "USER: hi ASSISTANT:"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"prompt": PROMPT, "max_tokens": 4}

# sampling field → values past what it becomes (float32 / int32 / the generator's seed) or NaN/inf
BAD_SAMPLING = {
    "temperature": [1e39, float("inf"), float("nan"), -1],
    "top_p": [float("nan"), 1.5],
    "top_k": [2**31, -2],
    "min_p": [float("nan"), 2],
    "seed": [2**64, -2**63 - 1],
    "presence_penalty": [float("inf"), 3],
    "frequency_penalty": [float("nan")],
    "repetition_penalty": [1e-300, float("inf"), 0],
    "logit_bias": [{"5": 1e39}, {"5": float("nan")}, {str(2**40): 1}],
    "stop_token_ids": [[2**40]],
}
# /generate's names where they differ from OpenAI's
NATIVE_NAME = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
BAD_NATIVE_ONLY = {"max_new_tokens": [2**31, 1e3], "min_new_tokens": [2**40]}
BAD_OPENAI_ONLY = {"max_tokens": [2**31], "min_tokens": [2**40], "n": [0, 2**63]}
BAD_GENERATE_FIELDS = {"video_fps": [float("nan"), float("inf"), 0, -1], "video_num_frames": [0, 2**40],
                       "logprob_start_len": [-5, 2**40], "top_logprobs_num": [10**6, -1]}
BAD_UPLOAD = {"temperature": ["1e39", "inf", "nan", "null"], "top_p": ["nan"], "top_k": [str(2**31)],
              "seed": [str(2**64)], "max_new_tokens": [str(2**31)], "fps": ["inf", "0"], "num_frames": ["0"]}


def _post_json(http, path: str, body: dict):
    """NaN and Infinity as Python's json writes them (JavaScript's literals): clients do send them."""
    return http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def assert_names(r, field: str) -> None:
    assert r.status_code == 400, (field, r.status_code, r.text[:400])
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert field in error["message"] or field == error["param"], (field, error)


def _cases(table: dict) -> list:
    return [(field, value) for field, values in table.items() for value in values]


@pytest.mark.parametrize("field,value", _cases(BAD_SAMPLING | BAD_OPENAI_ONLY))
def test_openai_routes_refuse_numbers_the_engine_cannot_compute(server, http, field, value):
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        for stream in (False, True):
            assert_names(_post_json(http, path, body | {field: value, "stream": stream, "regex": "a|b"}), field)
    assert_leak_free(server[0])


@pytest.mark.parametrize("field,value", _cases(BAD_SAMPLING | BAD_NATIVE_ONLY))
def test_generate_refuses_numbers_the_engine_cannot_compute(server, http, field, value):
    name = NATIVE_NAME.get(field, field)
    for stream in (False, True):
        body = {"text": PROMPT, "stream": stream, "sampling_params": {"max_new_tokens": 4, "regex": "a|b", name: value}}
        assert_names(_post_json(http, "/generate", body), name)
    assert_leak_free(server[0])


@pytest.mark.parametrize("field,value", _cases(BAD_GENERATE_FIELDS))
def test_generate_refuses_bad_request_numbers_with_or_without_media(server, http, field, value):
    assert_names(_post_json(http, "/generate", {"text": PROMPT, field: value,
                                                "sampling_params": {"max_new_tokens": 2}}),
                 field)


@pytest.mark.parametrize("field,value", _cases(BAD_UPLOAD))
def test_upload_refuses_numbers_the_engine_cannot_compute(server, http, field, value):
    """Multipart carries text: "null" for a number is refused, never read as unset or as a string."""
    assert_names(http.post("/upload", data={"prompt": "hi", "max_new_tokens": "2", field: value}
                           if field != "max_new_tokens"
                           else {"prompt": "hi", field: value}), field)
    assert_leak_free(server[0])


def test_tokenize_and_detokenize_refuse_out_of_range_ids(http):
    assert_names(http.post("/detokenize", json={"tokens": [2**70]}), "tokens")
    assert_names(http.post("/detokenize", json={"tokens": [-1]}), "tokens")
    assert http.post("/tokenize", json={"prompt": "hi"}).status_code == 200


@pytest.mark.parametrize("temperature", [1e38, 3.4e38, 1e30])
def test_a_huge_finite_temperature_with_a_constraint_samples_the_allowed_tokens(server, http, temperature):
    """Near-uniform over the tokens the regex allows: every answer matches it, none is a 500."""
    params = {"max_new_tokens": 4, "temperature": temperature, "regex": "a|b"}
    r = http.post("/generate", json={"text": PROMPT, "sampling_params": params})
    assert r.status_code == 200, r.text[:400]
    assert r.json()["text"] in ("a", "b")
    chat = http.post("/v1/chat/completions", json=CHAT | {"temperature": temperature, "regex": "(yes|no)"})
    assert chat.status_code == 200, chat.text[:400]
    assert chat.json()["choices"][0]["message"]["content"] in ("yes", "no")
    with http.stream("POST", "/generate", json={"text": PROMPT, "sampling_params": params, "stream": True}) as s:
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert s.status_code == 200 and events[-1] == "[DONE]"
    assert all("error" not in json.loads(e) for e in events[:-1]), events
    assert_leak_free(server[0])


def test_extreme_legal_penalties_and_biases_are_served(server, http):
    """A float32-normal repetition_penalty sends positive logits past float32 (held finite); the largest
    biases and penalties, top_p at its smallest, logprobs of a constrained row (its masked tokens are
    no alternatives): each a 200 with finite numbers."""
    body = CHAT | {"repetition_penalty": 1.2e-38, "presence_penalty": -2, "frequency_penalty": 2,
                   "logit_bias": {"5": 100, "6": -100}, "top_p": 1e-300, "temperature": 3e38, "seed": 2**64 - 1,
                   "regex": "(yes|no)", "logprobs": True, "top_logprobs": 20}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text[:400]
    for token in r.json()["choices"][0]["logprobs"]["content"]:
        assert len(token["top_logprobs"]) <= 20 and all(alt["logprob"] > float("-inf") for alt in token["top_logprobs"])
    assert_leak_free(server[0])


def test_a_constraint_that_min_tokens_makes_unsatisfiable_is_that_requests_400(server, http):
    """The regex allows only tokens spelling "a"; min_tokens bans them (as stop_token_ids) and EOS:
    no token is left to sample. The sampler's last line of defence fails that request alone, as a
    400 (in a stream, its error event says invalid_request_error), and the server serves on."""
    engine = server[0]
    a_ids = [i for i in range(engine.loaded.config.text.vocab_size) if engine.tokenizer.decode([i]).strip() == "a"]
    body = COMPLETION | {"regex": "a", "min_tokens": 2, "stop_token_ids": a_ids}
    assert_names(http.post("/v1/completions", json=body), "no token can be sampled")
    with http.stream("POST", "/v1/completions", json=body | {"stream": True}) as s:
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["type"] == "invalid_request_error", events
    assert http.post("/v1/completions", json=COMPLETION).status_code == 200
    assert_leak_free(server[0])
