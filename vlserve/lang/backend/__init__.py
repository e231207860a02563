"""Backends: Engine (in-process), RuntimeEndpoint (a vlserve server), OpenAI (any OpenAI-compatible API)."""

from vlserve.lang.backend.base import BaseBackend


def as_backend(backend) -> BaseBackend:
    """A backend as given; a vlserve Engine is wrapped so programs run on it in-process."""
    if isinstance(backend, BaseBackend):
        return backend
    from vlserve.engine.engine import Engine

    if isinstance(backend, Engine):
        from vlserve.lang.backend.engine import EngineBackend

        return EngineBackend(backend)
    raise TypeError(f"not a backend: {type(backend).__name__}; use an Engine, RuntimeEndpoint or OpenAI")
