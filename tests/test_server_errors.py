"""Every malformed request gets a 4xx in OpenAI's error shape naming the problem; the server stays
healthy and leaks nothing (pool gauges checked after each). Also: API key, body limit, busy queue."""

import base64
import json

import httpx
import pytest

from helpers.server_helpers import assert_leak_free, data_uri, image_message, mp4, png, png_bomb, start_server
from vlserve.server.app import build_app
from vlserve.server.background import BackgroundServer
from vlserve.server.args import ServerArgs


def user(content) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4}


def image_chat(uri: str) -> dict:
    return {"messages": image_message(uri), "max_tokens": 4}


def video_chat(data: bytes) -> dict:
    video = {"type": "video_url", "video_url": {"url": data_uri(data, "video/mp4")}}
    return {"messages": [{"role": "user", "content": [video]}],
            "max_tokens": 4}


_PNG = png(seed=11)
CHAT_CASES = {
    "malformed json": (b'{"messages": [', "not valid JSON"),
    "messages not a list": ({"messages": "hi"}, "messages"),
    "max_tokens wrong type": (user("hi") | {"max_tokens": "lots"}, "max_tokens"),
    "empty messages": ({"messages": []}, "messages"),
    "unknown role": ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    "unknown part type": (user([{"type": "audio", "audio": "x"}]), "type"),
    "missing content": ({"messages": [{"role": "user"}]}, "messages.0.content"),
    "image in a system message": ({"messages": [{"role": "system", "content": [
        {"type": "image_url", "image_url": {"url": data_uri(_PNG)}}]}, {"role": "user", "content": "hi"}]},
        "content.0.type: Input should be 'text'"),
    "invalid base64": (image_chat("data:image/png;base64,@@not base64@@"), "not valid base64"),
    "not an image": (image_chat(data_uri(b"these bytes are plain text, not a picture")), "not a supported image"),
    "truncated image": (image_chat(data_uri(_PNG[:len(_PNG) // 2])), "truncated or corrupt"),
    "decompression bomb": (image_chat(data_uri(png_bomb())), "max_image_pixels"),
    "unsupported video": (video_chat(b"RIFF\x00\x00\x00\x00AVI LIST" + bytes(500)), "not a supported container"),
    "corrupt video": (video_chat(mp4(4)[:48] + bytes(2000)), "video"),
    "url fetch disabled": (image_chat("http://127.0.0.1:1/cat.png"), "allow_url_fetch"),
    "prompt over the context": (user("hello " * 3000), "context length"),
    "max_tokens zero": (user("hi") | {"max_tokens": 0}, "max_tokens"),
    "max_tokens over the context": (user("hi") | {"max_tokens": 5000}, "context length"),
    "negative temperature": (user("hi") | {"temperature": -0.5}, "temperature"),
    "top_p zero": (user("hi") | {"top_p": 0}, "top_p"),
    "n zero": (user("hi") | {"n": 0}, "n"),
    "n too large": (user("hi") | {"n": 1000}, "n"),
    "empty stop string": (user("hi") | {"stop": [""]}, "stop"),
    "too many images": ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_uri(_PNG)}}] * 17}]}, "max_images_per_request"),
    "more image markers than images": (user("<image> <image> what?"), "markers"),
    "response_format without schema": (user("hi") | {"response_format": {"type": "json_schema"}}, "schema"),
}


@pytest.mark.parametrize("case", list(CHAT_CASES))
def test_malformed_chat_requests(server, http, case):
    body, expected = CHAT_CASES[case]
    for stream in (False, True):  # a refused stream is refused as JSON, before any event is sent
        if isinstance(body, bytes):
            r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        else:
            r = http.post("/v1/chat/completions", json=body | {"stream": stream})
        assert_error(r, 400, expected)
    assert_leak_free(server[0])


GENERATE_CASES = {
    "text and input_ids": ({"text": "a", "input_ids": [1]}, "exactly one of text or input_ids"),
    "neither text nor input_ids": ({"sampling_params": {}}, "exactly one of text or input_ids"),
    "unknown sampling parameter": ({"text": "a", "sampling_params": {"temprature": 1}}, "unknown sampling parameter"),
    "negative max_new_tokens": ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    "top_k zero": ({"text": "a", "sampling_params": {"top_k": 0}}, "top_k"),
    "input_ids out of the vocabulary": ({"input_ids": [1, 10**9]}, "input_ids"),
    "input_ids wrong type": ({"input_ids": "1 2 3"}, "input_ids"),
    "image_data wrong type": ({"text": "a", "image_data": 5}, "image_data"),
    "fps and num_frames together": ({"text": "a", "video_data": data_uri(mp4(3), "video/mp4"), "video_fps": 2,
                                     "video_num_frames": 2}, "either num_frames or fps"),
    "too many frames": ({"text": "a", "video_data": data_uri(mp4(3), "video/mp4"), "video_num_frames": 1000},
                        "video_max_frames"),
    "batch stream": ({"text": ["a", "b"], "stream": True}, "stream"),
    "batch media list too short": ({"text": ["a", "b"], "image_data": [data_uri(_PNG)]}, "image_data"),
    "empty prompt": ({"input_ids": []}, "empty"),
    "seed over 64 bits": ({"text": "a", "sampling_params": {"seed": 2**70}}, "seed"),
    "top_k over 31 bits": ({"text": "a", "sampling_params": {"top_k": 2**70, "temperature": 1}}, "top_k"),
    "skip_special_tokens not a boolean": ({"text": "a", "sampling_params": {"skip_special_tokens": "no"}},
                                          "skip_special_tokens"),
}


def test_a_denormal_temperature_samples_greedily_instead_of_failing_the_batch(server, http):
    """Found by the fuzzer: logits / 5e-324 overflowed to inf, NaN probabilities failed the forward."""
    body = {"prompt": "Hello", "max_tokens": 4}
    tiny = http.post("/v1/completions", json=body | {"temperature": 5e-324, "top_p": 5e-324})
    greedy = http.post("/v1/completions", json=body | {"temperature": 0})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    assert_leak_free(server[0])


@pytest.mark.parametrize("case", list(GENERATE_CASES))
def test_malformed_generate_requests(server, http, case):
    body, expected = GENERATE_CASES[case]
    assert_error(http.post("/generate", json=body), 400, expected)
    assert_leak_free(server[0])


def test_malformed_uploads(server, http):
    assert_error(http.post("/upload", files={"image": ("a.png", _PNG, "image/png")}), 400, "prompt")
    assert_error(http.post("/upload", files={"image": ("a.txt", b"not an image at all", "text/plain")},
                           data={"prompt": "hi"}), 400, "not a supported image")
    assert_error(http.post("/upload", files=[("video", ("a.mp4", mp4(2), "video/mp4"))] * 2, data={"prompt": "hi"}),
                 400, "at most one video")
    assert_error(http.post("/upload", files={"image": ("a.png", _PNG, "image/png")},
                           data={"prompt": "hi", "max_new_tokens": "many"}), 400, "max_new_tokens")
    assert_error(http.post("/upload", json={"prompt": "hi"}), 400, "prompt")
    assert_leak_free(server[0])


def test_unknown_route_and_method_are_json_errors(http):
    assert_error(http.get("/v1/nothing"), 404, "Not Found")
    assert_error(http.get("/generate"), 405, "Method Not Allowed")


def test_api_key_and_body_limit(server):
    engine = server[0]
    args = ServerArgs(port=0, api_key="sekret", max_request_bytes=20_000)
    with BackgroundServer(engine, args) as guarded, httpx.Client(base_url=guarded.url, timeout=60) as c:
        assert_error(c.post("/generate", json={"text": "hi"}), 401, "API key")
        assert_error(c.post("/generate", json={"text": "hi"}, headers={"Authorization": "Bearer wrong"}),
                     401, "API key")
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200  # open by choice
        auth = {"Authorization": "Bearer sekret"}
        ok = c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}, headers=auth)
        assert ok.status_code == 200
        big = {"text": "hi", "image_data": base64.b64encode(bytes(30_000)).decode()}
        assert_error(c.post("/generate", json=big, headers=auth), 413, "max_request_bytes")

        def chunked():  # no Content-Length: the limit is enforced while reading
            yield json.dumps(big).encode()

        assert_error(c.post("/generate", content=chunked(), headers=auth | {"content-type": "application/json"}),
                     413, "max_request_bytes")
    assert_leak_free(engine, server[1].url)


def test_full_waiting_queue_is_503_with_retry_after(server, http, monkeypatch):
    monkeypatch.setattr(server[0].args, "max_waiting_requests", 0)
    r = http.post("/v1/chat/completions", json=user("hi") | {"n": 2})
    assert_error(r, 503, "waiting queue is full")
    assert r.headers["retry-after"] == "1"
    assert_error(http.post("/generate", json={"text": "hi", "stream": True}), 503, "busy")
    monkeypatch.undo()
    assert http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}).status_code == 200
    assert_leak_free(server[0], server[1].url)


def test_health_is_503_when_the_engine_loop_is_gone():
    engine, srv = start_server()
    try:
        assert httpx.get(srv.url + "/health").status_code == 200
        engine.shutdown()
        assert_error(httpx.get(srv.url + "/health"), 503, "engine loop")
    finally:
        srv.stop()


def assert_error(r: httpx.Response, status: int, expected: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:500])
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert expected.lower() in (error["message"] + " " + str(error["param"])).lower(), error


def test_the_api_key_guards_every_route_that_does_work(server):
    """Every route but /health and /metrics (read from the app's own OpenAPI schema, so a new route is
    covered the day it is added) answers 401 without the key."""
    engine = server[0]
    args = ServerArgs(port=0, api_key="sekret")
    app = BackgroundServer(engine, args)
    paths = build_app(engine, args).openapi()["paths"]
    routes = [(path, sorted(methods)[0].upper()) for path, methods in paths.items()
              if path not in ("/health", "/metrics")]
    assert {"/flush_cache", "/tokenize", "/get_server_info", "/generate", "/upload", "/v1/chat/completions"} <= {
        p for p, _ in routes}
    with app as guarded, httpx.Client(base_url=guarded.url, timeout=60) as c:
        for path, method in routes:
            assert_error(c.request(method, path), 401, "API key")
        assert c.post("/flush_cache", headers={"Authorization": "Bearer sekret"}).status_code in (200, 400)


def test_oversized_headers_are_refused_and_harm_nothing(server, http):
    """uvicorn's h11 parser bounds a request head (16 KiB by default): a 64 KiB header gets a 4xx or
    a closed connection, never a hang, and the server goes on."""
    import socket

    host, port = server[1].url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n")
        try:
            answer = s.recv(4096)
        except (ConnectionResetError, socket.timeout):
            answer = b""
    assert answer == b"" or answer.split(b" ")[1].startswith(b"4"), answer[:100]
    assert http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}).status_code == 200
