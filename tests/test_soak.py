"""The soak and chaos harness for a bounded time in the suite (benchmarks/soak.py runs it for an hour):
every scenario ran, no check failed, no client hung, the invariants held after every phase, memory
levelled off, and the server degrades to 503s under overload and recovers."""

import httpx
import pytest

from helpers.server_helpers import start_server
from vlserve.bench.soak_driver import Soak, ramp

pytestmark = pytest.mark.slow

SOAK_MINUTES = 1.5


def test_mixed_traffic_with_faults_loses_nothing():
    engine, srv = start_server(max_total_tokens=2560, max_running_requests=32)
    try:
        report = Soak(engine, srv.url, clients=6, seed=1).run(SOAK_MINUTES, phase_s=20)
    finally:
        srv.stop()
        engine.shutdown()
    assert not report.failures, report.failures[:10]
    ran = {key.split(":")[0] for key in report.outcomes}
    assert {"chat_repeated_image", "generate_json", "stream_dropped", "bad_input", "control", "upload"} <= ran, ran
    assert len(report.phases) >= 4
    rss = [ph["rss_mb"] for ph in report.phases]
    assert rss[-1] - rss[1] < 300, f"RSS keeps growing: {rss}"  # after warm-up, it levels off
    assert report.phases[-1]["fds"] - report.phases[0]["fds"] < 20


def test_overload_degrades_to_503_and_recovers():
    engine, srv = start_server(max_waiting_requests=4)
    try:
        steps = ramp(srv.url, steps=(2, 48), seconds=4)
        assert all(not s["other"] for s in steps), steps  # nothing but 200 and 503
        assert steps[-1]["busy_share"] > 0 and steps[-1]["ok_per_s"] > 0
        after = httpx.post(srv.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                           timeout=60)
        assert after.status_code == 200
        assert engine.wait_idle(60)
        engine.scheduler.cm.check_idle_accounting()
    finally:
        srv.stop()
        engine.shutdown()
