"""vLLM's and SGLang's metric names for vlserve's measurements (`--metrics-names vllm|sglang`).

The tables hold every name the projects' own Grafana dashboards query (vLLM:
examples/online_serving/prometheus_grafana/grafana.json; SGLang:
examples/monitoring/grafana/dashboards/json/sglang-dashboard.json), so a user's existing dashboard
works unchanged. Samples are renamed at scrape time from the vlserve_ series; gauges those projects
compute differently (cache usage, hit rate, throughput) are derived here.
"""

import time

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

RENAMES = {
    "vllm": {
        "vlserve_e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
        "vlserve_time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
        "vlserve_time_per_output_token_seconds": "vllm:time_per_output_token_seconds",
        "vlserve_inter_token_latency_seconds": "vllm:inter_token_latency_seconds",
        "vlserve_queue_time_seconds": "vllm:request_queue_time_seconds",
        "vlserve_request_prefill_time_seconds": "vllm:request_prefill_time_seconds",
        "vlserve_request_decode_time_seconds": "vllm:request_decode_time_seconds",
        "vlserve_prompt_tokens": "vllm:prompt_tokens",
        "vlserve_generation_tokens": "vllm:generation_tokens",
        "vlserve_num_running_requests": "vllm:num_requests_running",
        "vlserve_num_waiting_requests": "vllm:num_requests_waiting",
        "vlserve_request_prompt_tokens": "vllm:request_prompt_tokens",
        "vlserve_request_generation_tokens": "vllm:request_generation_tokens",
        "vlserve_finished_requests": "vllm:request_success",
    },
    "sglang": {
        "vlserve_e2e_request_latency_seconds": "sglang:e2e_request_latency_seconds",
        "vlserve_time_to_first_token_seconds": "sglang:time_to_first_token_seconds",
        "vlserve_inter_token_latency_seconds": "sglang:inter_token_latency_seconds",
        "vlserve_queue_time_seconds": "sglang:queue_time_seconds",
        "vlserve_prompt_tokens": "sglang:prompt_tokens",
        "vlserve_generation_tokens": "sglang:generation_tokens",
        "vlserve_num_running_requests": "sglang:num_running_reqs",
        "vlserve_num_waiting_requests": "sglang:num_queue_reqs",
    },
}
# vLLM's dashboard also plots one histogram under a second name (max tokens of a sequence group: n=1 here)
COPIES = {"vllm": {"vlserve_request_generation_tokens": "vllm:request_max_num_generation_tokens"}}


class AliasCollector:
    def __init__(self, native: CollectorRegistry, flavour: str, model_name: str):
        if flavour not in RENAMES:
            raise ValueError(f"unknown metric names {flavour!r}; use one of {sorted(RENAMES)}")
        self.native, self.flavour, self.model_name = native, flavour, model_name
        self._last_tokens: tuple[float, float] | None = None  # (time, generation tokens) at the last scrape

    def collect(self):
        values = {}
        for family in self.native.collect():
            values[family.name] = family
            for table in (RENAMES[self.flavour], COPIES.get(self.flavour, {})):
                if family.name in table:
                    yield _renamed(family, table[family.name])
        yield from self._derived(values)

    def _derived(self, families: dict):
        total = _sum(families, "vlserve_kv_pool_capacity_tokens")
        used = _sum(families, "vlserve_kv_pool_tokens", state="in_use")
        usage = used / total if total else 0.0
        names = {"vllm": ["vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"], "sglang": ["sglang:token_usage"]}
        for name in names[self.flavour]:
            yield self._gauge(name, "Share of the KV pool held by running requests", usage)
        if self.flavour == "sglang":
            prompt, cached = _sum(families, "vlserve_prompt_tokens"), _sum(families, "vlserve_cached_prompt_tokens")
            yield self._gauge("sglang:cache_hit_rate", "Prompt tokens served from the cache, over all prompts",
                              cached / prompt if prompt else 0.0)
            yield self._gauge("sglang:gen_throughput", "Generated tokens per second since the last scrape",
                              self._throughput(_sum(families, "vlserve_generation_tokens")))

    def _throughput(self, tokens: float) -> float:
        now, last = time.monotonic(), self._last_tokens
        self._last_tokens = (now, tokens)
        return (tokens - last[1]) / (now - last[0]) if last and now > last[0] else 0.0

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family


def _renamed(family: Metric, name: str) -> Metric:
    out = Metric(name, family.documentation, family.type, family.unit)
    out.samples = [s._replace(name=name + s.name[len(family.name):]) for s in family.samples]
    return out


def _sum(families: dict, name: str, **labels) -> float:
    family = families.get(name)
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples if s.name in (name, name + "_total")
               and all(s.labels.get(k) == v for k, v in labels.items()))
