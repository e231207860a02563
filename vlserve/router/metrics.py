"""The router's /metrics (Prometheus), one series per worker URL."""

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class RouterMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("vlserve_router_requests", "requests sent to each worker (retries included)",
                                ["worker"], registry=self.registry)
        self.cache_hits = Counter("vlserve_router_cache_hits", "requests sent to a worker for what it had cached "
                                  "(the cache-aware choice, not the least-loaded one)", ["worker"],
                                  registry=self.registry)
        self.matched_tokens = Counter("vlserve_router_matched_tokens", "key tokens the chosen worker's tree matched",
                                      ["worker"], registry=self.registry)
        self.retries = Counter("vlserve_router_retries", "requests retried elsewhere after this worker failed",
                               ["worker"], registry=self.registry)
        self.failures = Counter("vlserve_router_worker_failures", "times this worker was taken out",
                                ["worker"], registry=self.registry)
        self.load = Gauge("vlserve_router_worker_load", "requests in flight on each worker", ["worker"],
                          registry=self.registry)
        self.healthy = Gauge("vlserve_router_worker_healthy", "1 while the worker is in rotation", ["worker"],
                             registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
