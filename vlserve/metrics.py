"""Prometheus metrics, one registry per engine. Every series carries a model_name label.

Our names (prefix vlserve_) are an interface other programs rely on. With --metrics-names vllm or
sglang the same measurements are also exported under the names those projects' Grafana dashboards
query (vllm:…, sglang:…), renamed at scrape time by AliasCollector (metrics_aliases.py).
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from vlserve.metrics_aliases import AliasCollector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


class Bound:
    """A metric with model_name already set: .inc/.set/.observe, or .labels(other labels)."""

    def __init__(self, metric, model_name: str):
        self.metric, self.model_name = metric, model_name
        self.child = metric.labels(model_name=model_name) if metric._labelnames == ("model_name",) else None

    def labels(self, **labels):
        return self.metric.labels(model_name=self.model_name, **labels)

    def __getattr__(self, name):  # inc, set, observe, _value, … of the only child
        return getattr(self.child, name)


class Metrics:
    def __init__(self, model_name: str = "vlserve", names: str = "vlserve"):
        self.model_name = model_name
        r = self.registry = CollectorRegistry()
        self.aliases = None
        if names != "vlserve":
            self.aliases = CollectorRegistry()
            self.aliases.register(AliasCollector(r, names, model_name))

        def make(kind, name, doc, labels=(), **kw):
            return Bound(kind(name, doc, ["model_name", *labels], registry=r, **kw), model_name)

        def hist(name, doc, buckets=LATENCY_BUCKETS):
            return make(Histogram, name, doc, buckets=buckets)

        self.prompt_tokens = make(Counter, "vlserve_prompt_tokens", "Prompt tokens of finished prefills")
        self.cached_prompt_tokens = make(Counter, "vlserve_cached_prompt_tokens",
                                         "Prompt tokens served from the radix cache")
        self.generation_tokens = make(Counter, "vlserve_generation_tokens", "Generated tokens")
        self.requests = make(Counter, "vlserve_requests", "Finished requests by status", ["status"])
        self.finished = make(Counter, "vlserve_finished_requests", "Finished requests by finish reason",
                             ["finished_reason"])
        self.kv_capacity = make(Gauge, "vlserve_kv_pool_capacity_tokens", "KV pool capacity in tokens")
        self.kv_tokens = make(Gauge, "vlserve_kv_pool_tokens", "KV pool tokens by state", ["state"])
        self.forward_passes = make(Counter, "vlserve_forward_passes", "Model forward passes by mode", ["mode"])
        self.vision_encoder_images = make(Counter, "vlserve_vision_encoder_images",
                                          "Images run through the vision tower")
        self.vision_cache_hits = make(Counter, "vlserve_vision_cache_hits",
                                      "Images whose embedding came from the vision cache")
        self.vision_tower_runs = make(Counter, "vlserve_vision_tower_runs",
                                      "Vision tower forwards (each encodes one step's images in one batch)")
        self.media_decodes = make(Counter, "vlserve_media_decodes",
                                  "Media items decoded, resized and hashed (each item once, however many "
                                  "requests carry it at a time)", ["kind"])
        self.media_frames_reused = make(Counter, "vlserve_media_frames_reused",
                                        "Sampled video frames taken from an earlier clip with the same compressed "
                                        "packets instead of being decoded, resized and hashed again")
        self.waiting = make(Gauge, "vlserve_num_waiting_requests", "Requests in the waiting queue")
        self.running = make(Gauge, "vlserve_num_running_requests", "Requests admitted and running")
        self.ttft = hist("vlserve_time_to_first_token_seconds", "Time to first token")
        self.e2e = hist("vlserve_e2e_request_latency_seconds", "End-to-end request latency")
        self.queue_time = hist("vlserve_queue_time_seconds", "Arrival to first admission")
        self.prefill_time = hist("vlserve_request_prefill_time_seconds", "First admission to first token")
        self.decode_time = hist("vlserve_request_decode_time_seconds", "First token to the end of the request")
        self.tpot = hist("vlserve_time_per_output_token_seconds",
                         "Mean time per output token after the first, per request", TOKEN_LATENCY_BUCKETS)
        self.itl = hist("vlserve_inter_token_latency_seconds", "Time between two output steps of a request",
                        TOKEN_LATENCY_BUCKETS)
        self.grammar_compile_time = hist("vlserve_grammar_compile_seconds",
                                         "Time to compile a regex or JSON schema, cache misses only (failures too)")
        self.grammar_compile_failures = make(Counter, "vlserve_grammar_compile_failures",
                                             "Regex / JSON schema compiles that failed, by reason (invalid, "
                                             "states, timeout, memory, error)", ["reason"])
        self.request_prompt_tokens = hist("vlserve_request_prompt_tokens", "Prompt tokens per request", LENGTH_BUCKETS)
        self.request_generation_tokens = hist("vlserve_request_generation_tokens", "Generated tokens per request",
                                              LENGTH_BUCKETS)

    def observe_grammar_compile(self, seconds: float, outcome: str) -> None:
        self.grammar_compile_time.observe(seconds)
        if outcome != "ok":
            self.grammar_compile_failures.labels(reason=outcome).inc()

    def exposition(self) -> bytes:
        """The Prometheus text format of every series (and their aliases)."""
        return generate_latest(self.registry) + (generate_latest(self.aliases) if self.aliases else b"")

    @staticmethod
    def value(metric, **labels) -> float:
        return (metric.labels(**labels) if labels else metric)._value.get()
