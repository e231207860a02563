"""Running a benchmark's own torch work (a GEMM peak, an in-process peer like transformers) on a
thread that ends with it, and its OpenMP workers with it. Left on the caller's thread, those workers
would stay and share the cores with the engine's: libgomp then counts the process oversubscribed and
its workers sleep between parallel regions (vlserve/engine/compute_thread.py)."""

from typing import Callable, TypeVar

from vlserve.engine.compute_thread import ComputeThread

T = TypeVar("T")


def on_own_thread(fn: Callable[[], T], name: str = "bench") -> T:
    thread = ComputeThread(name)
    try:
        return thread.run(fn)  # its exception, if any, is raised here
    finally:
        thread.hand_over(lambda: None)
        thread.join()
