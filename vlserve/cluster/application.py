"""The application builder: `serve run vlserve.cluster:app model=DIR num_replicas=N [flag=value ...]`.

Arguments: any `vlserve serve` option by its field name (model, max_total_tokens, num_threads, ...;
strings from the command line are converted by the field's type), plus num_replicas, replica_num_cpus
(CPUs Ray reserves for each engine, default 1; replica_num_gpus likewise) and the router's
cache_threshold, balance_abs_threshold, balance_rel_threshold, max_tree_size. model is a
directory every node can read or a Hugging Face id (each node resolves it through its own cache).
"""

import dataclasses

from vlserve.server.args import ServerArgs

ROUTER_ARGS = {"cache_threshold": float, "balance_abs_threshold": int, "balance_rel_threshold": float,
               "max_tree_size": int}
REPLICA_ARGS = {"num_replicas": int, "replica_num_cpus": float, "replica_num_gpus": float}


def app(args: dict):
    """The Serve application (ingress + engine deployment) for these arguments."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from vlserve.cluster.ingress import Ingress
    from vlserve.cluster.replica import EngineReplica
    from vlserve.cluster.request_router import CacheAwareRequestRouter
    from vlserve.model.builtin import builtin_model_path
    from vlserve.model.hub import resolve_model_path

    server, router, replica = split_args(args)
    server.setdefault("model", builtin_model_path())
    ServerArgs(**server)  # a bad option fails here, before any replica starts
    engines = serve.deployment(EngineReplica, name="VLServeEngine").options(
        num_replicas=replica.get("num_replicas", 1),
        ray_actor_options={"num_cpus": replica.get("replica_num_cpus", 1.0),
                           "num_gpus": replica.get("replica_num_gpus", 0.0)},
        max_ongoing_requests=server.get("max_running_requests", ServerArgs.max_running_requests) * 2,
        request_router_config=RequestRouterConfig(request_router_class=CacheAwareRequestRouter,
                                                  request_router_kwargs=router),
    ).bind(server)
    ingress = serve.deployment(Ingress, name="VLServeIngress").options(ray_actor_options={"num_cpus": 0})
    keys_from = resolve_model_path(server["model"], server.get("revision"), weights=False)  # a Hub id: its snapshot
    return ingress.bind(engines, keys_from, server.get("chat_template"))


def split_args(args: dict) -> tuple[dict, dict, dict]:
    """(ServerArgs fields, router kwargs, replica options), each value converted to its type."""
    types = {f.name: f.type for f in dataclasses.fields(ServerArgs) if f.name not in ("host", "port", "dp_size")}
    server, router, replica = {}, {}, {}
    for name, value in args.items():
        if name in ROUTER_ARGS:
            router[name] = ROUTER_ARGS[name](value)
        elif name in REPLICA_ARGS:
            replica[name] = REPLICA_ARGS[name](value)
        elif name in types:
            server[name] = _typed(value, types[name])
        else:
            raise ValueError(f"vlserve.cluster:app: unknown argument {name!r} (a `vlserve serve` option by its "
                             f"field name, or one of {sorted(ROUTER_ARGS) + sorted(REPLICA_ARGS)})")
    return server, router, replica


def _typed(value, annotation):
    if not isinstance(value, str):
        return value
    kind = str(annotation)
    if "bool" in kind:
        return value.lower() in ("1", "true", "yes", "on")
    if value.lower() == "none" and "None" in kind:
        return None
    return int(value) if "int" in kind else float(value) if "float" in kind else value
