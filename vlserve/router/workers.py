"""The router's workers: choosing one (policy.py), counting load, health checks.

Runs on the router's event loop only, so no lock: choose + acquire happen with no await between.
A worker that fails a request or a health check is taken out (its tree cleared: a restarted worker
has an empty cache) and comes back when /health answers 200 again.
"""

import asyncio
import logging
from dataclasses import dataclass, field

import httpx

from vlserve.router.metrics import RouterMetrics
from vlserve.router.policy import Choice, PolicyConfig, choose, record
from vlserve.router.tree import ApproxTree
from vlserve.router.worker import Worker

log = logging.getLogger(__name__)


class NoWorker(Exception):
    """No healthy worker is left to take the request."""


@dataclass
class WorkerPool:
    urls: list[str]
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    tree_max_tokens: int = 1 << 22
    health_interval_s: float = 2.0
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    workers: list[Worker] = field(init=False)

    def __post_init__(self):
        if not self.urls:
            raise ValueError("give at least one worker URL")
        self.workers = [Worker(url.rstrip("/"), i, ApproxTree(self.tree_max_tokens)) for i, url in enumerate(self.urls)]
        for w in self.workers:
            self.metrics.healthy.labels(w.url).set(1)

    def healthy(self) -> list[Worker]:
        return [w for w in self.workers if w.healthy]

    def acquire(self, key: list[int] | None, exclude: tuple[Worker, ...] = ()) -> Choice:
        """Chooses a worker for the key and counts the request on it (the caller releases it)."""
        candidates = [w for w in self.healthy() if w not in exclude]
        if not candidates:
            raise NoWorker("no healthy worker is available")
        choice = choose(candidates, key, self.policy)
        record(choice, key)
        choice.worker.acquire()
        self._count(choice)
        return choice

    def release(self, worker: Worker) -> None:
        worker.release()
        self.metrics.load.labels(worker.url).set(worker.load)

    def fail(self, worker: Worker, reason: str) -> None:
        if worker.healthy:
            log.warning("worker %s taken out: %s", worker.url, reason)
            worker.take_out()
            self.metrics.failures.labels(worker.url).inc()
            self.metrics.healthy.labels(worker.url).set(0)

    def _count(self, choice: Choice) -> None:
        url = choice.worker.url
        self.metrics.requests.labels(url).inc()
        self.metrics.matched_tokens.labels(url).inc(choice.matched)
        if choice.cache_hit:
            self.metrics.cache_hits.labels(url).inc()
        self.metrics.load.labels(url).set(choice.worker.load)

    # ---- health ---------------------------------------------------------------------------------
    async def check_health(self, client: httpx.AsyncClient) -> None:
        """One round: every worker's /health; a failure takes it out, a success brings it back."""
        results = await asyncio.gather(*(self._probe(client, w) for w in self.workers))
        for worker, ok in zip(self.workers, results):
            if ok and not worker.healthy:
                log.info("worker %s is back", worker.url)
                worker.healthy = True
                self.metrics.healthy.labels(worker.url).set(1)
            elif not ok:
                self.fail(worker, "health check failed")

    async def health_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            await self.check_health(client)
            await asyncio.sleep(self.health_interval_s)

    @staticmethod
    async def _probe(client: httpx.AsyncClient, worker: Worker) -> bool:
        try:
            return (await client.get(worker.url + "/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False
