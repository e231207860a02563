"""The router in front of two real worker servers (tiny model): groups of requests that share an image
stay on one worker, both workers get groups, the cache is used as well as one worker would use it;
streams pass through; a worker that fails is taken out and its requests go elsewhere; /metrics."""

import asyncio

import httpx
import pytest

from helpers.router_helpers import app_thread, group_requests
from helpers.server_helpers import assert_leak_free, data_uri, metric_values, png, start_server, tiny_model_dir
from vlserve.router.keys import RouteKeys
from vlserve.router.model_files import ModelFiles
from vlserve.router.args import RouterArgs
from vlserve.router.proxy import WORKER_HEADER, build_router_app
from vlserve.router.serve import make_keys
from vlserve.router.workers import WorkerPool


@pytest.fixture(scope="module")
def workers():
    pairs = [start_server() for _ in range(2)]
    yield pairs
    for engine, server in pairs:
        server.stop()
        engine.shutdown()


def router_app(urls: list[str], **pool_kw):
    return build_router_app(WorkerPool(urls, **pool_kw), RouteKeys(ModelFiles.read(tiny_model_dir())))


async def send_all(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(client.post(url + "/v1/chat/completions", json=b) for b in bodies))


def cached(responses: list[httpx.Response]) -> int:
    return sum(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in responses)


def flush(url: str) -> None:
    assert httpx.post(url + "/flush_cache", timeout=30).status_code == 200


def test_groups_stick_to_one_worker_and_keep_the_cache(workers):
    urls = [server.url for _, server in workers]
    requests = group_requests()
    bodies = [body for _, body in requests]
    flush(urls[0])
    baseline = cached(asyncio.run(send_all(urls[0], bodies)))  # one worker, the same requests, concurrently
    assert baseline > 0
    with app_thread(router_app(urls)) as router:
        flush(router.url)
        responses = asyncio.run(send_all(router.url, bodies))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
        where: dict[int, set[str]] = {}
        for (group, _), r in zip(requests, responses):
            where.setdefault(group, set()).add(r.headers[WORKER_HEADER])
        assert all(len(w) == 1 for w in where.values()), where
        assert {u for w in where.values() for u in w} == set(urls)
        total = cached(responses)
        print(f"cached_tokens: router over 2 workers {total}, one worker {baseline}")
        assert total >= 0.9 * baseline, (total, baseline)
        metrics = httpx.get(router.url + "/metrics").text
        sent = metric_values(metrics, "vlserve_router_requests_total")
        hits = metric_values(metrics, "vlserve_router_cache_hits_total")
        assert sum(sent.values()) == len(bodies) and set(sent) == {f'worker="{u}"' for u in urls}
        assert sum(hits.values()) >= len(bodies) - 4 * 2  # at most the first of a group on each worker misses
    for engine, server in workers:
        assert_leak_free(engine, server.url)


def test_routes_and_streaming_pass_through(workers):
    urls = [server.url for _, server in workers]
    body = group_requests(1, 1, max_tokens=6)[0][1]
    direct = httpx.post(urls[0] + "/v1/chat/completions", json=body, timeout=60).json()
    with app_thread(router_app(urls)) as router:
        via = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=60).json()
        assert via["choices"][0]["message"] == direct["choices"][0]["message"]
        with httpx.stream("POST", router.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) > 2
        assert httpx.get(router.url + "/v1/models").json()["data"][0]["id"] == direct["model"]
        native = httpx.post(router.url + "/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 3}})
        assert native.status_code == 200 and "meta_info" in native.json()
        assert httpx.post(router.url + "/v1/chat/completions", json={"messages": []}).status_code == 400  # the worker's
        health = httpx.get(router.url + "/health").json()
        assert health["status"] == "ok" and health["workers"] == 2
    for engine, server in workers:
        assert_leak_free(engine, server.url)


def test_a_failed_worker_is_taken_out_and_its_requests_retried(workers):
    engine, doomed = start_server()
    dead = doomed.url
    urls = [dead] + [server.url for _, server in workers]
    try:
        with app_thread(router_app(urls, health_interval_s=60)) as router:
            doomed.stop()  # it passed the first health check; now it refuses connections
            bodies = [body for _, body in group_requests(4, 2)]
            responses = asyncio.run(send_all(router.url, bodies))
            assert [r.status_code for r in responses] == [200] * len(bodies)
            assert dead not in {r.headers[WORKER_HEADER] for r in responses}
            metrics = httpx.get(router.url + "/metrics").text
            assert metric_values(metrics, "vlserve_router_retries_total")[f'worker="{dead}"'] >= 1
            assert metric_values(metrics, "vlserve_router_worker_healthy")[f'worker="{dead}"'] == 0
            assert httpx.get(router.url + "/health").json()["workers"] == 2
    finally:
        engine.shutdown()


def test_model_files_from_a_worker_and_the_api_key(workers):
    urls = [server.url for _, server in workers]
    keys = make_keys(RouterArgs(worker_urls=urls), wait_s=10)  # no --model-path: asks /get_model_info
    assert keys.key("/v1/completions", b'{"prompt": "Hi"}') == workers[0][0].tokenize(prompt="Hi")
    with app_thread(build_router_app(WorkerPool(urls), keys, api_key="sesame")) as router:
        body = {"prompt": "Hi", "max_tokens": 2}
        assert httpx.post(router.url + "/v1/completions", json=body).status_code == 401
        ok = httpx.post(router.url + "/v1/completions", json=body, headers={"Authorization": "Bearer sesame"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] is not None
        assert httpx.get(router.url + "/health").status_code == 200  # open, as on the server


def test_a_media_uuid_without_data_is_answered_by_whichever_worker_the_router_picks(workers):
    urls = [server.url for _, server in workers]
    image = data_uri(png(seed=71))

    def chat(part: dict) -> dict:
        return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}],
                "max_tokens": 4, "temperature": 0}

    pool = WorkerPool(urls, health_interval_s=60)
    with app_thread(build_router_app(pool, RouteKeys(ModelFiles.read(tiny_model_dir())))) as router:
        first = httpx.post(router.url + "/v1/chat/completions", timeout=60,
                           json=chat({"type": "image_url", "image_url": {"url": image}, "uuid": "pic-71"}))
        assert first.status_code == 200, first.text
        holder = next(w for w in pool.workers if w.url == first.headers[WORKER_HEADER])
        pool.fail(holder, "taken out by the test")  # the uuid-only request must go to the worker that never saw it
        by_id = httpx.post(router.url + "/v1/chat/completions", json=chat({"type": "image_url", "uuid": "pic-71"}),
                           timeout=60)
        assert by_id.status_code == 200, by_id.text
        other = by_id.headers[WORKER_HEADER]
        assert other != holder.url
        with_bytes = chat({"type": "image_url", "image_url": {"url": image}})
        resent = httpx.post(other + "/v1/chat/completions", json=with_bytes, timeout=60).json()
        assert by_id.json()["choices"][0]["message"] == resent["choices"][0]["message"]
        assert by_id.json()["usage"]["prompt_tokens"] == resent["usage"]["prompt_tokens"]
        unknown = httpx.post(router.url + "/v1/chat/completions", json=chat({"type": "video_url", "uuid": "never-72"}))
        assert unknown.status_code == 400 and "never-72" in unknown.json()["error"]["message"]
        assert unknown.json()["error"]["param"] == "uuid"
