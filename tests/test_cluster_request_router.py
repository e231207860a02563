"""The Ray Serve request router's own logic, without a cluster: Ray awaits a queue probe between choosing
a replica and routing the request, so choices for a burst of requests interleave with nothing routed.
(tests/test_cluster_ray.py runs the router inside a real Ray Serve application.)"""

import asyncio
from dataclasses import dataclass

from ray.serve._private.common import DeploymentID, ReplicaID, RequestMetadata
from ray.serve.request_router import PendingRequest

from vlserve.cluster.request_router import ROUTE_KEY, CacheAwareRequestRouter


@dataclass
class Replica:
    """What the router reads of Ray's RunningReplica (which needs a live actor handle)."""
    replica_id: ReplicaID
    max_ongoing_requests: int = 4


def _router() -> CacheAwareRequestRouter:
    router = CacheAwareRequestRouter.__new__(CacheAwareRequestRouter)  # Ray's __init__ wants a live controller
    router.initialize_state(cache_threshold=0.3)
    return router


def _replicas(n: int) -> list[Replica]:
    deployment = DeploymentID(name="VLServeEngine", app_name="default")
    return [Replica(ReplicaID(unique_id=f"r{i}", deployment_id=deployment)) for i in range(n)]


def _request(key: list[int], n: int) -> PendingRequest:
    return PendingRequest(args=[], kwargs={ROUTE_KEY: key}, future=None,  # the future: Ray's, unused here
                          metadata=RequestMetadata(request_id=str(n), internal_request_id=f"i{n}"))


def _choose(router, replicas, request) -> list[list[Replica]]:
    return asyncio.run(router.choose_replicas(replicas, request))


def test_a_burst_for_one_image_goes_to_one_replica_before_any_is_routed():
    router, replicas = _router(), _replicas(2)
    image_a, image_b = [-7] * 20 + [1, 2, 3], [-9] * 20 + [1, 2, 3]
    chosen = [_choose(router, replicas, _request(key + [n], n))
              for n, key in enumerate([image_a, image_a, image_b, image_a, image_b, image_b])]
    assert all(len(ranks) == 1 and len(ranks[0]) == 1 for ranks in chosen), chosen
    names = [ranks[0][0].replica_id.unique_id for ranks in chosen]
    assert names[0] == names[1] == names[3] and names[2] == names[4] == names[5], names
    assert names[0] != names[2], "the second image should go to the replica with the smaller tree"


def test_no_cold_second_rank_and_a_full_replica_is_passed_over():
    router, replicas = _router(), _replicas(2)
    key = [-7] * 20 + [1, 2, 3]
    first = _choose(router, replicas, _request(key, 0))[0][0]
    for n in range(first.max_ongoing_requests):
        request = _request(key + [n], n)
        assert _choose(router, replicas, request) == [[first]]  # a slow probe retries here, not elsewhere
        router.on_request_routed(request, first.replica_id, None)
    other = _choose(router, replicas, _request(key + [99], 99))
    assert other == [[next(r for r in replicas if r is not first)]], "the full replica was chosen"
    router.on_request_completed(first.replica_id, "i0")
    assert router.by_replica[first.replica_id.unique_id].load == first.max_ongoing_requests - 1
