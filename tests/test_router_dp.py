"""`vlserve serve --dp-size 2` end to end, as a user runs it: one command, two engine processes behind
the router. It answers as one engine does; an engine killed (SIGKILL) mid-run loses no request that
had not started streaming; SIGTERM on the front stops everything, no process left behind."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from helpers.router_helpers import child_pids, group_requests
from helpers.server_helpers import tiny_model_dir, wait_healthy

pytestmark = pytest.mark.distributed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_front(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vlserve", "serve", "--dp-size", "2", "--model", tiny_model_dir(),
                             "--port", str(port), "--max-total-tokens", "4096", "--num-threads", "1",
                             "--shutdown-timeout", "5", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _pid_serving(port: int, pids: set[int]) -> int:
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        if b"--port" in argv and argv[argv.index(b"--port") + 1] == str(port).encode():
            return pid
    raise AssertionError(f"no engine process on port {port}")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def _send(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(client.post(url + "/v1/chat/completions", json=b) for b in bodies))


def _kill_when_busy(url: str, pids: set[int]) -> int:
    """Waits until both engines have requests in flight, then SIGKILLs the first; its pid."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        workers = httpx.get(url + "/workers", timeout=5).json()
        if all(w["load"] > 0 for w in workers):
            victim = _pid_serving(int(workers[0]["url"].rsplit(":", 1)[1]), pids)
            os.kill(victim, signal.SIGKILL)
            return victim
        time.sleep(0.005)
    raise AssertionError("the engines never both had requests in flight")


def test_dp_size_2_serves_survives_a_killed_engine_and_stops_clean():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    front = _start_front(port)
    try:
        wait_healthy(front, url)
        engines = child_pids(front.pid)
        workers = httpx.get(url + "/workers").json()
        assert len(workers) == 2 and all(w["healthy"] for w in workers)

        body = group_requests(1, 1, max_tokens=8)[0][1]
        direct = httpx.post(workers[1]["url"] + "/v1/chat/completions", json=body, timeout=60).json()
        via = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
        assert via["choices"][0]["message"] == direct["choices"][0]["message"]
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == os.path.basename(tiny_model_dir())

        bodies = [{**b, "max_tokens": 160, "ignore_eos": True} for _, b in group_requests(4, 3)]
        loop = asyncio.new_event_loop()
        sending = loop.run_in_executor(None, lambda: asyncio.run(_send(url, bodies)))
        victim = _kill_when_busy(url, engines)
        responses = loop.run_until_complete(sending)
        loop.close()
        assert [r.status_code for r in responses] == [200] * len(bodies), [r.text for r in responses]
        assert all(r.json()["usage"]["completion_tokens"] == 160 for r in responses)
        assert not _alive(victim)

        front.send_signal(signal.SIGTERM)
        assert front.wait(timeout=60) == 0, front.stdout.read()
        end = time.monotonic() + 30  # the front has returned; its children are on their way out
        while [pid for pid in engines if _alive(pid)] and time.monotonic() < end:
            time.sleep(0.1)
        assert not [pid for pid in engines if _alive(pid)]
    finally:
        if front.poll() is None:
            front.kill()
            front.wait()
