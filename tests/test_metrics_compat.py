"""Metrics for dashboards: vLLM's and SGLang's own Grafana dashboards work against vlserve.

The names below are every metric those dashboards' JSON queries (vLLM:
examples/online_serving/prometheus_grafana/grafana.json; SGLang:
examples/monitoring/grafana/dashboards/json/sglang-dashboard.json), each with the model_name label
the dashboards filter on. Also: the latency histograms vlserve adds, the periodic engine log line
and --log-requests.
"""

import logging
import re

import httpx
import pytest

from helpers.server_helpers import served_model, start_server
from vlserve import Engine
from vlserve.engine.stats_log import StatsLog
from vlserve.testing.tiny import make_tiny_model

VLLM_DASHBOARD = [
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count", "vllm:gpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total", "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
]
SGLANG_DASHBOARD = [
    "sglang:e2e_request_latency_seconds_bucket", "sglang:e2e_request_latency_seconds_sum",
    "sglang:e2e_request_latency_seconds_count", "sglang:time_to_first_token_seconds_bucket",
    "sglang:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_count",
    "sglang:num_running_reqs", "sglang:gen_throughput", "sglang:cache_hit_rate", "sglang:num_queue_reqs",
]
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("metrics")), seed=2)


def _series(text: str, name: str) -> list[str]:
    """The label sets of every sample of `name` in Prometheus text."""
    return re.findall(rf"^{re.escape(name)}(?:\{{(.*?)\}})? \S+$", text, re.M)


@pytest.mark.parametrize("flavour,names", [("vllm", VLLM_DASHBOARD), ("sglang", SGLANG_DASHBOARD)])
def test_the_dashboards_find_every_metric_they_query(model_dir, flavour, names):
    with Engine(model_dir, max_total_tokens=2048, metrics_names=flavour, served_model_name="llava") as engine:
        engine.generate(prompt=["USER: hi ASSISTANT:"] * 2, sampling_params=GREEDY)
        text = engine.metrics.exposition().decode()
    missing = [n for n in names if not _series(text, n)]
    assert not missing, f"{flavour} dashboard metrics missing: {missing}"
    for n in names:
        assert all('model_name="llava"' in labels for labels in _series(text, n)), n
    if flavour == "vllm":  # the finish-reason panel groups by this label
        assert any('finished_reason="length"' in s for s in _series(text, "vllm:request_success_total"))


def test_latency_histograms_count_what_happened(model_dir):
    with Engine(model_dir, max_total_tokens=2048) as engine:
        engine.generate(prompt=["USER: a ASSISTANT:", "USER: b ASSISTANT:"], sampling_params=GREEDY)
        m = engine.metrics
        text = m.exposition().decode()

    def count(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}_count\{{.*?\}} (\S+)$", text, re.M))

    assert count("vlserve_queue_time_seconds") == 2 and count("vlserve_time_per_output_token_seconds") == 2
    assert count("vlserve_inter_token_latency_seconds") == 2 * (GREEDY["max_new_tokens"] - 1)
    assert count("vlserve_request_generation_tokens") == 2
    assert m.value(m.finished, finished_reason="length") == 2


def test_the_server_exports_aliases_on_metrics():
    engine, srv = start_server(metrics_names="vllm")
    try:
        httpx.post(srv.url + "/generate", json={"text": "hi", "sampling_params": GREEDY}, timeout=60)
        text = httpx.get(srv.url + "/metrics", timeout=10).text
    finally:
        srv.stop()
        engine.shutdown()
    assert _series(text, "vllm:generation_tokens_total") == [f'model_name="{served_model()}"']
    assert _series(text, "vlserve_generation_tokens_total")  # our own names stay


def test_periodic_engine_line_and_request_log(model_dir, caplog):
    caplog.set_level(logging.INFO)
    with Engine(model_dir, max_total_tokens=2048, log_requests=True, log_stats_interval=3600) as engine:
        engine.generate(prompt="USER: hello ASSISTANT:", sampling_params=GREEDY)
        stats = StatsLog(engine.metrics, engine.pool_state, lambda: (1, 2), interval_s=1e-9)
        stats._last = (stats._last[0], 0.0, 0.0)  # as if the tokens above came after the last line
        line = stats.maybe_log()
    assert line and "1 running, 2 waiting" in line and "generation" in line
    finished = [r.getMessage() for r in caplog.records if r.name == "vlserve.requests" and "finished" in r.getMessage()]
    assert len(finished) == 1 and "(length)" in finished[0] and f"{GREEDY['max_new_tokens']} generated" in finished[0]
