"""The engine's periodic log line while it is busy (SGLang prints one like it every few seconds):

    engine: 3 running, 0 waiting | KV pool 12.5% in use, 40.1% cached | cache hit rate 61.0% |
    prompt 812.0 tok/s, generation 95.3 tok/s
"""

import logging
import time
from dataclasses import dataclass, field

from vlserve.metrics import Metrics

log = logging.getLogger("vlserve.engine")


@dataclass
class StatsLog:
    metrics: Metrics
    pool_state: callable  # () -> {"free", "cached", "in_use"}
    queues: callable  # () -> (running, waiting)
    interval_s: float = 10.0
    _last: tuple[float, float, float] = field(default=(0.0, 0.0, 0.0))  # (time, prompt tokens, generated tokens)

    def __post_init__(self):
        self._last = (time.monotonic(), *self._totals())

    def maybe_log(self) -> str | None:
        """Logs (and returns) the line when interval_s has passed and something happened since."""
        now = time.monotonic()
        if self.interval_s <= 0 or now - self._last[0] < self.interval_s:
            return None
        prompt, generated = self._totals()
        running, waiting = self.queues()
        if (prompt, generated) == self._last[1:] and not running and not waiting:
            self._last = (now, prompt, generated)
            return None
        line = self._line(now, prompt, generated, running, waiting)
        self._last = (now, prompt, generated)
        log.info(line)
        return line

    def _line(self, now: float, prompt: float, generated: float, running: int, waiting: int) -> str:
        pool = self.pool_state()
        capacity = max(1, sum(pool.values()))
        m = self.metrics
        total_prompt, cached = m.value(m.prompt_tokens), m.value(m.cached_prompt_tokens)
        elapsed = max(1e-9, now - self._last[0])
        return (f"engine: {running} running, {waiting} waiting | KV pool {pool['in_use'] / capacity:.1%} in use, "
                f"{pool['cached'] / capacity:.1%} cached | cache hit rate "
                f"{cached / total_prompt if total_prompt else 0:.1%} | "
                f"prompt {(prompt - self._last[1]) / elapsed:.1f} tok/s, "
                f"generation {(generated - self._last[2]) / elapsed:.1f} tok/s")

    def _totals(self) -> tuple[float, float]:
        return self.metrics.value(self.metrics.prompt_tokens), self.metrics.value(self.metrics.generation_tokens)
