"""Timing helpers the benchmark scripts share."""

import time
from typing import Callable


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` calls of fn, in ms, after one untimed call (a shared machine's noise
    only ever adds time)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3
