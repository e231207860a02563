"""The language's process-wide settings (SGLang's global_config)."""

from dataclasses import dataclass


@dataclass
class GlobalConfig:
    default_backend: object = None
    # run_batch sends a traced constant prefix with max_new_tokens=0 before the programs run.
    enable_precache_with_tracing: bool = True
    # fork(n > 1) first sends the shared prefix with max_new_tokens=0 (off only to measure what it buys).
    enable_fork_hint: bool = True


global_config = GlobalConfig()
