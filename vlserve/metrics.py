"""Prometheus metrics (names are an interface other programs rely on; prefix vlserve_). One registry per engine."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.prompt_tokens = Counter("vlserve_prompt_tokens", "Prompt tokens of finished prefills", registry=r)
        self.cached_prompt_tokens = Counter("vlserve_cached_prompt_tokens", "Prompt tokens served from the radix cache", registry=r)
        self.generation_tokens = Counter("vlserve_generation_tokens", "Generated tokens", registry=r)
        self.requests = Counter("vlserve_requests", "Finished requests by status", ["status"], registry=r)
        self.kv_capacity = Gauge("vlserve_kv_pool_capacity_tokens", "KV pool capacity in tokens", registry=r)
        self.kv_tokens = Gauge("vlserve_kv_pool_tokens", "KV pool tokens by state", ["state"], registry=r)
        self.forward_passes = Counter("vlserve_forward_passes", "Model forward passes by mode", ["mode"], registry=r)
        self.vision_encoder_images = Counter("vlserve_vision_encoder_images", "Images run through the vision tower", registry=r)
        self.vision_cache_hits = Counter("vlserve_vision_cache_hits", "Images whose embedding came from the vision cache", registry=r)
        self.ttft = Histogram("vlserve_time_to_first_token_seconds", "Time to first token", buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("vlserve_e2e_request_latency_seconds", "End-to-end request latency", buckets=LATENCY_BUCKETS, registry=r)
        self.waiting = Gauge("vlserve_num_waiting_requests", "Requests in the waiting queue", registry=r)
        self.running = Gauge("vlserve_num_running_requests", "Requests admitted and running", registry=r)

    @staticmethod
    def value(counter, **labels) -> float:
        return (counter.labels(**labels) if labels else counter)._value.get()
