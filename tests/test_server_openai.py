"""The OpenAI-compatible routes through the official `openai` client and raw HTTP, on one real server."""

import json

import openai
import pytest

from helpers.server_helpers import data_uri, image_message, metric_values, mp4, png, served_model

MODEL = served_model()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1].url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_health_models_and_metrics(http, client):
    assert http.get("/health").json() == {"status": "ok"}
    models = client.models.list()
    assert len(models.data) == 1 and models.data[0].id.startswith("vlserve-server-tests-")  # the checkpoint dir
    assert models.data[0].id == http.get("/v1/models").json()["data"][0]["id"]
    text = http.get("/metrics").text
    for name in ("vlserve_prompt_tokens_total", "vlserve_cached_prompt_tokens_total", "vlserve_generation_tokens_total",
                 "vlserve_kv_pool_capacity_tokens", "vlserve_vision_encoder_images_total",
                 "vlserve_vision_cache_hits_total", "vlserve_time_to_first_token_seconds_bucket",
                 "vlserve_e2e_request_latency_seconds_bucket"):
        assert name in text, name
    assert metric_values(text, "vlserve_kv_pool_capacity_tokens")[""] == 4096


def test_plain_chat_through_the_openai_client(client):
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello!"}],
                                         max_tokens=6, temperature=0)
    choice = out.choices[0]
    assert out.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= out.usage.completion_tokens <= 6
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.usage.prompt_tokens_details.cached_tokens >= 0
    again = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello!"}],
                                           max_tokens=6, temperature=0)
    assert again.choices[0].message.content == choice.message.content  # greedy is deterministic


def test_streaming_chat_matches_the_plain_answer_and_reports_usage(client):
    messages = [{"role": "user", "content": "Describe the picture."}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt was just served


def test_the_same_image_twice_hits_the_cache(client):
    messages = image_message(data_uri(png(seed=1234)))
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens == second.usage.prompt_tokens >= 16  # 16 tokens per image
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens_details.cached_tokens + 16
    assert second.choices[0].message.content == first.choices[0].message.content


def test_a_different_image_of_the_same_size_misses_the_cache(client):
    a = client.chat.completions.create(model=MODEL, messages=image_message(data_uri(png(seed=77))), max_tokens=2,
                                       temperature=0)
    b = client.chat.completions.create(model=MODEL, messages=image_message(data_uri(png(seed=78))), max_tokens=2,
                                       temperature=0)
    # only the template text before the image can be shared
    assert b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens - 16
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_video_part_expands_to_frames(client):
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data_uri(mp4(6), "video/mp4")}},
                                             {"type": "text", "text": "What happens?"}]}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
    text_only = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What happens?"}],
                                               max_tokens=2, temperature=0)
    assert out.usage.prompt_tokens >= text_only.usage.prompt_tokens + 6 * 16  # 6 frames of 16 tokens


def test_n_choices_share_the_prompt_and_count_it_once(client):
    messages = image_message(data_uri(png(seed=5)), "Two answers please.")
    one = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=1.0, seed=3)
    many = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=1.0, seed=3, n=3)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert many.usage.prompt_tokens == one.usage.prompt_tokens
    assert 3 <= many.usage.completion_tokens <= 15  # all choices count
    assert many.usage.prompt_tokens_details.cached_tokens >= 16  # the image was cached by the first request
    assert len({c.message.content for c in many.choices}) > 1  # choice i samples with seed + i


def test_stop_strings_trim_the_answer(client):
    base = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=12,
                                          temperature=0).choices[0].message.content
    stop = next((base[i:i + 2] for i in range(1, len(base) - 1) if base[i:i + 2].strip()), None)
    if stop is None:
        pytest.fail("the random model's answer has no usable stop string: pick another prompt")
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=12,
                                         temperature=0, stop=[stop])
    assert out.choices[0].message.content == base[:base.index(stop)]
    assert out.choices[0].finish_reason == "stop"


def test_default_max_tokens_is_what_the_context_leaves(http):
    out = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Tell me a story."}],
                                                  "temperature": 0, "stop": None, "ignore_eos": True}).json()
    assert out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] == 2048  # the context
    assert out["choices"][0]["finish_reason"] == "length"
    out = http.post("/v1/completions", json={"prompt": [40] * 2000, "temperature": 0}).json()  # context: 2048
    assert out["usage"]["prompt_tokens"] == 2000
    assert 1 <= out["usage"]["completion_tokens"] <= 48, out
    r = http.post("/v1/completions", json={"prompt": [40] * 2000, "max_tokens": 49})  # asked for: refused
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]


def test_completions_text_batch_ids_and_stream(http, client):
    out = client.completions.create(model=MODEL, prompt=["Hello", "The quick brown"], max_tokens=3, temperature=0)
    assert [c.index for c in out.choices] == [0, 1]
    by_ids = http.post("/v1/completions", json={"prompt": [[1, 40, 41, 42]], "max_tokens": 3, "temperature": 0}).json()
    assert by_ids["object"] == "text_completion" and len(by_ids["choices"]) == 1
    stream = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == out.choices[0].text


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["answer", "ok"], "additionalProperties": False}


def test_response_format_json_schema(server, http, client):
    body = {"messages": [{"role": "user", "content": "Give JSON"}], "max_tokens": 64, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = json.loads(r.json()["choices"][0]["message"]["content"])
    assert set(out) == {"answer", "ok"} and isinstance(out["answer"], int) and isinstance(out["ok"], bool)
    streamed = client.chat.completions.create(model=MODEL, stream=True, **{k: v for k, v in body.items()})
    streamed_text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert streamed_text == r.json()["choices"][0]["message"]["content"]
    bad = http.post("/v1/chat/completions", json=body | {"response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}})
    assert bad.status_code == 400 and "schema" in bad.json()["error"]["message"]


def test_raw_sse_framing_ends_with_done(http):
    with http.stream("POST", "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                           "max_tokens": 3, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    assert all(json.loads(line[6:])["object"] == "chat.completion.chunk" for line in lines[:-1])


def test_sse_events_survive_clients_that_split_lines_like_splitlines():
    """httpx's iter_lines (and anything built on str.splitlines) also ends a line at U+0085, U+2028 and
    U+2029, which JSON leaves raw in strings: a generated one cut an event in two (seen in CI)."""
    from httpx._decoders import LineDecoder

    from vlserve.server.sse import event

    text = "a\u2028b\x85c\u2029d é"
    lines = [line for line in LineDecoder().decode(event({"choices": [{"text": text}]})) if line]
    assert len(lines) == 1 and json.loads(lines[0][6:])["choices"][0]["text"] == text
