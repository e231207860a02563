"""`--max-queued-requests` under bursts: many requests at once never queue more than the limit.

A request is queued from its submission until admission moves it into the running batch: first in
the engine loop's inbox, then in the scheduler's waiting queue (engine/loop.py). The first test holds
the loop between two steps, with --max-running-requests requests running, so that nothing leaves the
queue while a burst arrives: exactly the limit is accepted, every other request gets 503 at once,
and once the loop goes on every accepted request finishes. The second sends a burst to a `vlserve
serve` process running freely: every request is answered, in full or with the named 503, and the
server counts as finished exactly the requests it answered.
"""

import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers.server_helpers import assert_leak_free, metric_values, start_server, tiny_model_dir, wait_healthy

RUNNING, LIMIT, BURST = 2, 3, 40
LONG = {"max_new_tokens": 1000, "ignore_eos": True, "temperature": 0}


def burst(url: str, n: int, body: dict, answered: list | None = None, timeout: float = 300) -> list[httpx.Response]:
    """n requests at once (threads released together); every one's response, in order. `answered`
    gets each response as it arrives."""
    start, answered = threading.Barrier(n), [] if answered is None else answered

    def send(i: int) -> httpx.Response:
        with httpx.Client(timeout=timeout) as client:
            start.wait()
            r = client.post(url + "/generate", json=body)
            answered.append(r)
            return r

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(send, range(n)))


def assert_refused(r: httpx.Response) -> None:
    assert r.status_code == 503 and r.headers["retry-after"] == "1", (r.status_code, r.text[:300])
    assert "waiting queue is full" in r.json()["error"]["message"], r.text[:300]


def test_a_burst_while_nothing_leaves_the_queue_is_held_to_the_limit():
    engine, srv = start_server(max_running_requests=RUNNING, max_waiting_requests=LIMIT)
    pool = ThreadPoolExecutor(RUNNING + 1)
    release, held = threading.Event(), threading.Event()
    try:
        long_ones = [pool.submit(lambda: httpx.post(srv.url + "/generate", json={"text": "USER: go on ASSISTANT:",
                                                                                 "sampling_params": LONG}, timeout=600))
                     for _ in range(RUNNING)]

        def hold_when_full() -> bool:  # on the loop thread, between two steps
            if len(engine.scheduler.running) < RUNNING:
                return False
            held.set()
            release.wait(300)
            return True

        deadline = time.monotonic() + 120
        while not held.is_set():  # asked between every two steps until both long requests run
            tried = engine.loop.call(hold_when_full)
            while not (tried.done() or held.wait(0.01)):
                pass
            assert time.monotonic() < deadline, "the long requests were never both running"
        # The loop now waits in hold_when_full: nothing is admitted or finished until release.
        answered: list[httpx.Response] = []
        answers = pool.submit(burst, srv.url, BURST, {"text": "USER: hi ASSISTANT:",
                                                      "sampling_params": {"max_new_tokens": 2}}, answered)
        deadline = time.monotonic() + 120
        while len(answered) < BURST - LIMIT:  # the refusals come back at once; the accepted ones wait
            assert time.monotonic() < deadline, (f"{len(answered)} of {BURST} answered while the loop is held "
                                                 f"({engine.loop.queued} queued)")
            time.sleep(0.05)
        assert all(r.status_code == 503 for r in answered), [r.status_code for r in answered]
        assert engine.loop.queued == LIMIT  # the accepted ones, still in the inbox
        release.set()
        results = answers.result(timeout=300)
        running = [f.result(timeout=600) for f in long_ones]
        assert [r.status_code for r in running] == [200] * RUNNING
        ok = [r for r in results if r.status_code == 200]
        assert len(ok) == LIMIT, [r.status_code for r in results]
        assert all(r.json()["meta_info"]["completion_tokens"] == 2 for r in ok)
        for r in results:
            if r.status_code != 200:
                assert_refused(r)
        assert_leak_free(engine, srv.url)
        counts = metric_values(httpx.get(srv.url + "/metrics").text, "vlserve_requests_total")
        assert counts == {'status="ok"': RUNNING + LIMIT}, counts
    finally:
        release.set()
        pool.shutdown(wait=True)
        srv.stop()
        engine.shutdown()


@pytest.mark.slow
def test_a_burst_on_a_running_server_is_answered_in_full_or_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "vlserve", "serve", "--model", tiny_model_dir(), "--port", str(port),
               "--max-total-tokens", "4096", "--num-threads", "1", "--max-running-requests", "1",
               "--max-queued-requests", "2"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        results = burst(url, 64, {"text": "USER: tell me ASSISTANT:",
                                  "sampling_params": {"max_new_tokens": 128, "ignore_eos": True}})
        ok = [r for r in results if r.status_code == 200]
        for r in results:
            if r.status_code != 200:
                assert_refused(r)
        assert ok and len(ok) < len(results), [r.status_code for r in results]
        assert all(r.json()["meta_info"]["completion_tokens"] == 128 for r in ok)
        after = httpx.post(url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=60)
        assert after.status_code == 200 and httpx.get(url + "/health", timeout=10).status_code == 200
        counts = metric_values(httpx.get(url + "/metrics", timeout=10).text, "vlserve_requests_total")
        assert counts == {'status="ok"': len(ok) + 1}, counts  # none lost, none failed
    finally:
        proc.terminate()
        proc.wait(timeout=60)
