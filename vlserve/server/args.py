"""`vlserve serve` options: the engine's (vlserve/core/config.py) plus the HTTP server's own."""

from dataclasses import dataclass

from vlserve.core.config import MIXED_PREFILL_RATIO_HELP, EngineArgs, _opt


@dataclass
class ServerArgs(EngineArgs):
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | list[str] | None = _opt(None, "require 'Authorization: Bearer KEY' with one of these keys (as "
                                                 "vLLM's --api-key); each key's media uuids are its own", nargs="+")
    max_request_bytes: int = 64 * 1024 * 1024
    shutdown_timeout: float = _opt(30.0, "on SIGTERM/SIGINT: seconds running requests may finish before they are "
                                         "ended with an error")
    enable_metrics: bool = _opt(False, "accepted for SGLang compatibility: /metrics is always on")
    log_level: str = "info"
    dp_size: int = _opt(1, "data parallelism: this many engine processes behind one HTTP front (a cache-aware "
                           "router, vlserve/router/)")

    # a server's streams have readers: while they decode, a step's prefill takes about one decode step
    mixed_prefill_ratio: float = _opt(1.0, MIXED_PREFILL_RATIO_HELP)

    ALIASES = {**EngineArgs.ALIASES, "dp_size": ["--dp", "--data-parallel-size"]}

    def __post_init__(self):
        super().__post_init__()
        if self.dp_size < 1:
            raise ValueError(f"--dp-size must be >= 1, got {self.dp_size}")

