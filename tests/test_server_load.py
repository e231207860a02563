"""Under load: 64 concurrent streaming clients sharing images, a quarter of them disconnecting
mid-stream. Every other stream completes; the disconnected requests are aborted (not run to their
long max_tokens); nothing leaks."""

import asyncio
import json

import httpx
import pytest

from helpers.server_helpers import assert_leak_free, data_uri, image_message, metric_values, png, shared_server

CLIENTS = 64
DISCONNECT_EVERY = 4  # a quarter of the clients
COMPLETE_TOKENS = 12
ABANDONED_TOKENS = 1500  # would take far longer than the test's timeout unless aborted


@pytest.fixture(scope="module")
def server():
    engine, srv = shared_server()
    yield engine, srv
    assert_leak_free(engine, srv.url)


async def stream_client(client: httpx.AsyncClient, i: int, images: list[str]) -> dict:
    disconnect = i % DISCONNECT_EVERY == 0
    body = {"messages": image_message(images[i % len(images)], f"Question {i % 3}"), "temperature": 0,
            "max_tokens": ABANDONED_TOKENS if disconnect else COMPLETE_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}
    events = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line:
                continue
            events.append(line)
            if disconnect and len(events) >= 3:
                break  # leaving the block closes the connection mid-stream
    return {"disconnect": disconnect, "events": events}


async def run_clients(url: str) -> list[dict]:
    images = [data_uri(png(seed=100 + k)) for k in range(4)]
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.wait_for(asyncio.gather(*(stream_client(client, i, images) for i in range(CLIENTS))), 240)


def test_64_streams_a_quarter_disconnecting(server):
    engine, srv = server
    before = metric_values(httpx.get(srv.url + "/metrics").text, "vlserve_requests_total")
    results = asyncio.run(run_clients(srv.url))

    completed = [r for r in results if not r["disconnect"]]
    assert len(completed) == CLIENTS - CLIENTS // DISCONNECT_EVERY
    for r in completed:
        assert r["events"][-1] == "data: [DONE]"
        usage = json.loads(r["events"][-2][6:])["usage"]
        assert usage["completion_tokens"] <= COMPLETE_TOKENS
        finish = [json.loads(e[6:])["choices"][0]["finish_reason"] for e in r["events"][:-2]]
        assert finish[-1] in ("stop", "length")

    assert_leak_free(engine, srv.url, timeout=60)  # the abandoned 1500-token streams were aborted
    after = metric_values(httpx.get(srv.url + "/metrics").text, "vlserve_requests_total")
    aborted = after.get('status="abort"', 0) - before.get('status="abort"', 0)
    assert aborted == CLIENTS // DISCONNECT_EVERY
    assert after.get('status="ok"', 0) - before.get('status="ok"', 0) == len(completed)


def test_non_streaming_client_that_gives_up_is_aborted(server):
    engine, srv = server
    before = metric_values(httpx.get(srv.url + "/metrics").text, "vlserve_requests_total").get('status="abort"', 0)
    body = {"text": "Tell me everything.", "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/generate", json=body, timeout=0.5)
    assert_leak_free(engine, srv.url, timeout=60)
    after = metric_values(httpx.get(srv.url + "/metrics").text, "vlserve_requests_total").get('status="abort"', 0)
    assert after - before == 1
