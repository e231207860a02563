"""The documented default generation lengths, pinned exactly on every entry point: 128 new tokens on
the Engine and /generate (SGLang's default), the rest of the context on the OpenAI routes (vLLM's).

Bug caught: a changed default (e.g. 128 -> 16 in SamplingParams, or a fixed cap on the OpenAI
routes). An upper bound (`<= 128`) passes for 16; these tests pin the number.
"""

DEFAULT = 128  # docs/server.md: max_new_tokens / max_tokens default
NO_EOS = {"ignore_eos": True}


def test_engine_default_is_128(server):
    """Engine.generate without max_new_tokens, EOS ignored: exactly 128 tokens, finish_reason length."""
    engine, _ = server
    out = engine.generate(input_ids=[1, 40, 41, 42], sampling_params={**NO_EOS, "temperature": 0})
    assert len(out["output_ids"]) == DEFAULT
    assert out["meta_info"]["finish_reason"] == "length", out["meta_info"]


def test_native_generate_route_default_is_128(http):
    """POST /generate without max_new_tokens, EOS ignored: exactly 128 completion tokens."""
    out = http.post("/generate", json={"input_ids": [1, 40, 41, 42],
                                       "sampling_params": {**NO_EOS, "temperature": 0}}).json()
    assert out["meta_info"]["completion_tokens"] == DEFAULT, out["meta_info"]


CONTEXT = 2048  # the test server's model


def test_openai_completions_default_is_the_rest_of_the_context(http):
    """POST /v1/completions without max_tokens runs to the end of the context (as vLLM does), EOS ignored."""
    out = http.post("/v1/completions", json={"prompt": [1, 40, 41, 42], "temperature": 0, **NO_EOS}).json()
    assert out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] == CONTEXT, out["usage"]
    assert out["choices"][0]["finish_reason"] == "length"


def test_openai_chat_default_is_the_rest_of_the_context(http):
    """POST /v1/chat/completions without max_tokens or max_completion_tokens: the rest of the context."""
    out = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Tell me a story."}],
                                                  "temperature": 0, **NO_EOS}).json()
    assert out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] == CONTEXT, out["usage"]
    assert out["choices"][0]["finish_reason"] == "length"
