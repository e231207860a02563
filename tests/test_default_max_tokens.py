"""The documented default generation length is exactly 128 new tokens, on every entry point.

Bug caught: a changed default (e.g. 128 -> 16 in SamplingParams or in the OpenAI routes'
DEFAULT_MAX_TOKENS). An upper bound (`<= 128`) passes for 16; these tests pin the number.
"""

DEFAULT = 128  # README: max_new_tokens / max_tokens default
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


def _no_eos_within(http, route: str, body: dict, n: int) -> bool:
    """Whether greedy decoding of this request runs n tokens without stopping (finish_reason length)."""
    out = http.post(route, json={**body, "max_tokens": n, "temperature": 0}).json()
    return out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == n


def _openai_default_is_128(http, route: str, bodies: list[dict]) -> None:
    # The OpenAI routes have no ignore_eos: find a request whose greedy answer has no EOS within 129
    # tokens (asked for explicitly), then the same request without max_tokens must stop at exactly 128.
    body = next((b for b in bodies if _no_eos_within(http, route, b, DEFAULT + 1)), None)
    assert body is not None, "every candidate prompt hit EOS early; add longer-running candidates"
    out = http.post(route, json={**body, "temperature": 0}).json()
    assert out["usage"]["completion_tokens"] == DEFAULT, out["usage"]
    assert out["choices"][0]["finish_reason"] == "length"


def test_openai_completions_default_is_128(http):
    """POST /v1/completions without max_tokens stops at exactly 128 tokens (not 16, not 256)."""
    _openai_default_is_128(http, "/v1/completions",
                           [{"prompt": [1] + list(range(40 + i, 48 + i))} for i in range(0, 160, 8)])


def test_openai_chat_default_is_128(http):
    """POST /v1/chat/completions without max_tokens or max_completion_tokens stops at exactly 128."""
    _openai_default_is_128(http, "/v1/chat/completions",
                           [{"messages": [{"role": "user", "content": f"Tell me story number {i}."}]}
                            for i in range(20)])
