"""`vlserve serve` options: the engine's (vlserve/core/config.py) plus the HTTP server's own."""

import os
from dataclasses import dataclass

from vlserve.core.config import EngineArgs, _opt

BUILTIN_MODEL_NAME = "vlserve-builtin"


@dataclass
class ServerArgs(EngineArgs):
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = _opt(None, "require 'Authorization: Bearer KEY'")
    served_model_name: str | None = _opt(None, "the model name clients send and /v1/models lists "
                                               "(default: the model directory's name)")
    max_request_bytes: int = 64 * 1024 * 1024
    enable_metrics: bool = _opt(False, "accepted for SGLang compatibility: /metrics is always on")
    log_level: str = "info"

    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return os.path.basename(os.path.normpath(self.model)) if self.model else BUILTIN_MODEL_NAME
