"""A Ray Serve replica that is one vlserve engine with vlserve's own HTTP app (server/app.py).

The ingress hands it a whole HTTP request; it runs it through the app in this process (asgi_call.py)
and streams the answer back, so a replica answers exactly as `vlserve serve` does.
"""

from vlserve.cluster.asgi_call import HTTPCall, call_asgi
from vlserve.server.app import build_app, make_engine
from vlserve.server.args import ServerArgs

REPLICA_HEADER = "x-vlserve-replica"  # which replica answered


class EngineReplica:
    def __init__(self, server_args: dict):
        from ray import serve

        args = ServerArgs(**server_args)
        self.engine = make_engine(args)
        self.app = build_app(self.engine, args)
        self.name = serve.get_replica_context().replica_id.unique_id

    async def handle(self, call: HTTPCall, route_key: list[int] | None = None):
        """route_key is read by the request router (request_router.py), not here."""
        async for item in call_asgi(self.app, call):
            if isinstance(item, dict):
                item["headers"].append((REPLICA_HEADER, self.name))
            yield item

    def __del__(self):  # Ray Serve calls it when the replica is stopped
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
