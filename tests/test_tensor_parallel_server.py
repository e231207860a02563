"""`vlserve serve --tp-size 2` on the built-in model, end to end: it answers as tp_size=1 does; a
worker rank killed under it takes the server down (exit status 1) with a message naming the rank,
and no process is left behind. (A clean stop is Engine.shutdown, tested in
tests/test_tensor_parallel_engine.py; one server start here keeps the test short.)"""

import os
import signal
import subprocess
import sys

import httpx
import pytest

from helpers.tp_helpers import process_gone
from helpers.server_helpers import png, wait_healthy
from vlserve import Engine
from vlserve.distributed.group import free_port

pytestmark = pytest.mark.distributed

REQUEST = {"text": "USER: <image>\nWhat is in the picture? ASSISTANT:",
           "sampling_params": {"max_new_tokens": 8, "temperature": 0}}


def _serve_tp2() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vlserve", "serve", "--tp-size", "2", "--port", str(port),
                             "--max-total-tokens", "4096", "--num-threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url)
    return proc, url


def _worker_pids(pid: int) -> list[int]:
    """The server's spawned worker ranks (its children running multiprocessing's spawn_main). /proc
    lists children per thread: the engine's compute thread starts the ranks (compute_thread.py)."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            children += [int(c) for c in f.read().split()]
    found = []
    for child in children:
        try:
            with open(f"/proc/{child}/cmdline") as f:
                if "spawn_main" in f.read():
                    found.append(child)
        except FileNotFoundError:
            pass
    return found


def _generate(url: str, image: bytes) -> str:
    import base64

    body = {**REQUEST, "image_data": "data:image/png;base64," + base64.b64encode(image).decode()}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["text"]


def test_serve_tp2_answers_as_tp1_and_a_killed_rank_takes_it_down_with_a_clear_message():
    image = png(seed=4)
    with Engine(num_threads=1, max_total_tokens=4096) as engine:
        want = engine.generate(prompt=REQUEST["text"], image_data=[image], sampling_params=REQUEST["sampling_params"])
    proc, url = _serve_tp2()
    try:
        workers = _worker_pids(proc.pid)
        assert len(workers) == 1
        assert _generate(url, image) == want["text"]
        os.kill(workers[0], signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
        log = proc.stdout.read()
        assert "tensor-parallel rank 1" in log and "SIGKILL" in log, log[-3000:]
    finally:
        proc.kill()
    assert all(process_gone(pid) for pid in workers), "a worker rank outlived the server"
