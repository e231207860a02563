"""The cache-aware policy (vlserve/router/policy.py) as a Ray Serve request router.

Ray calls choose_replicas for each request sent through a handle to the engine deployment; the
request's radix key travels in its `route_key` keyword (the ingress computes it, vlserve/router/keys.py).
Each replica has its approximate tree (vlserve/router/tree.py), which takes a request's key when the
policy chooses the replica (and again when Ray routes the request there), and a load counted from the
moment Ray sends it a request (on_request_routed) to its completion (on_request_completed), streams
included.
"""

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from vlserve.router.policy import PolicyConfig, choose, record
from vlserve.router.tree import ApproxTree
from vlserve.router.worker import Worker

ROUTE_KEY = "route_key"


class CacheAwareRequestRouter(RequestRouter):
    def initialize_state(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                         balance_rel_threshold: float = 1.5, max_tree_size: int = 1 << 22, **_):
        self.policy = PolicyConfig(cache_threshold, balance_abs_threshold, balance_rel_threshold)
        self.max_tree_size = max_tree_size
        self.by_replica: dict[str, Worker] = {}
        self.in_flight: dict[str, Worker] = {}  # internal request id -> the replica counting it

    def _worker(self, replica_id: ReplicaID) -> Worker:
        name = replica_id.unique_id
        if name not in self.by_replica:  # index: order of first sight, the deterministic tie-breaker
            self.by_replica[name] = Worker(name, len(self.by_replica), ApproxTree(self.max_tree_size))
        return self.by_replica[name]

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """One rank, the policy's choice among the replicas not full by our own count.

        Ray probes the chosen replica's queue before sending, awaiting a reply while other requests are
        chosen; so the key enters the chosen tree here, not when the request is routed, or a burst of
        requests for one image would all see a cold tree and spread. A slow probe (a replica busy in its
        engine) makes Ray back off and ask again, and the policy gives the same replica: no second rank
        of cold replicas for a request to fall to, which would lose its prefix."""
        open_replicas = [r for r in candidate_replicas
                         if self._worker(r.replica_id).load < r.max_ongoing_requests] or candidate_replicas
        if not open_replicas:
            return []
        workers = [self._worker(r.replica_id) for r in open_replicas]
        key = pending_request.kwargs.get(ROUTE_KEY) if pending_request is not None else None
        choice = choose(workers, key, self.policy)
        record(choice, key)
        return [[next(r for r, w in zip(open_replicas, workers) if w is choice.worker)]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        worker = self._worker(replica_id)
        key = pending_request.kwargs.get(ROUTE_KEY)
        if key:
            worker.tree.insert(key)
        worker.acquire()
        self.in_flight[pending_request.metadata.internal_request_id] = worker

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        worker = self.in_flight.pop(internal_request_id, None)
        if worker is not None:
            worker.release()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.by_replica.pop(replica_id.unique_id, None)
