"""Every error vlserve raises for something a caller did, in one place.

Each message names the problem; the HTTP layer maps them (server/errors.py): bad input → 400,
EngineBusy → 503 with Retry-After.
"""

from vlserve.preprocess import MediaError  # raised inside preprocess/, which never imports vlserve


class InvalidRequest(ValueError):
    """A request the engine refuses; the message names the field and the problem (HTTP 400), and
    param the field where one is to blame."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ConstraintError(InvalidRequest):
    """An invalid, unsupported or unsatisfiable regex or JSON schema (HTTP 400)."""


class EngineBusy(RuntimeError):
    """The waiting queue is full (HTTP 503 with Retry-After)."""


class CheckpointError(ValueError):
    """A checkpoint directory that vlserve cannot load; the message names what is missing or unsupported."""


__all__ = ["CheckpointError", "ConstraintError", "EngineBusy", "InvalidRequest", "MediaError"]
