"""Ray Serve (vlserve.cluster:app) for real on one machine: ray.init(num_cpus=2), two replicas of the
tiny model behind the cache-aware request router. Requests that share an image stick to one replica,
the HTTP API answers as `vlserve serve` does (same text, streams, /v1/models, errors), and
serve.shutdown + ray.shutdown leave no process behind."""

import asyncio
import os
import socket
import time

import httpx
import pytest
import ray
from ray import serve

from helpers.router_helpers import child_pids, group_requests
from helpers.server_helpers import shared_server, tiny_model_dir
from vlserve.cluster import app
from vlserve.cluster.replica import REPLICA_HEADER


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _send(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=180) as client:
        return await asyncio.gather(*(client.post(url + "/v1/chat/completions", json=b) for b in bodies))


@pytest.mark.distributed
def test_ray_serve_replicas_route_by_image_and_answer_as_vlserve_serve():
    _, single = shared_server()  # `vlserve serve` on the same checkpoint, for comparison
    body = group_requests(1, 1, max_tokens=6)[0][1]
    expected = httpx.post(single.url + "/v1/chat/completions", json=body, timeout=60).json()
    before = child_pids(os.getpid())
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(app({"model": tiny_model_dir(), "num_replicas": "2", "max_total_tokens": "4096",
                       "num_threads": "1", "replica_num_cpus": "1"}), route_prefix="/")
        url = f"http://127.0.0.1:{port}"

        got = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        assert got["choices"][0]["message"] == expected["choices"][0]["message"]
        assert got["model"] == expected["model"]
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) > 2
        assert httpx.get(url + "/v1/models").json() ["data"][0]["id"] == expected["model"]
        bad = httpx.post(url + "/v1/chat/completions", json={"messages": []})
        assert bad.status_code == 400 and "error" in bad.json()
        assert httpx.get(url + "/health").status_code == 200

        requests = group_requests(4, 4)
        responses = asyncio.run(_send(url, [b for _, b in requests]))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        where: dict[int, set[str]] = {}
        for (group, _), r in zip(requests, responses):
            where.setdefault(group, set()).add(r.headers[REPLICA_HEADER])
        assert all(len(w) == 1 for w in where.values()), where
        assert len({w for ws in where.values() for w in ws}) == 2, where
    finally:
        serve.shutdown()
        ray.shutdown()
    end = time.monotonic() + 30
    while child_pids(os.getpid()) - before and time.monotonic() < end:
        time.sleep(0.5)
    assert not child_pids(os.getpid()) - before, "Ray processes left behind"


def test_serve_run_arguments_build_the_application():
    """`serve run vlserve.cluster:app k=v ...` calls the builder with strings, as Ray's CLI does."""
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    from vlserve.cluster.application import split_args

    built = call_user_app_builder_with_args_if_necessary(app, {"model": tiny_model_dir(), "num_replicas": "3"})
    assert type(built).__name__ == "Application"
    server, router, replica = split_args({"max_total_tokens": "4096", "disable_radix_cache": "true",
                                          "cache_threshold": "0.5", "num_replicas": "2", "chat_template": "None"})
    assert server == {"max_total_tokens": 4096, "disable_radix_cache": True, "chat_template": None}
    assert router == {"cache_threshold": 0.5} and replica == {"num_replicas": 2}
    with pytest.raises(ValueError, match="unknown argument 'colour'"):
        split_args({"colour": "red"})
