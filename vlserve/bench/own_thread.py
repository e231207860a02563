"""Running a benchmark's own torch work (a GEMM peak, an in-process peer like transformers) on a
thread that ends with it, and its OpenMP workers with it. Left on the caller's thread, those workers
would stay and share the cores with the engine's: libgomp then counts the process oversubscribed and
its workers sleep between parallel regions (vlserve/engine/compute_thread.py)."""

import threading
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def on_own_thread(fn: Callable[[], T], name: str = "bench") -> T:
    threads = torch.get_num_threads()
    result: list = []

    def run():
        torch.set_num_threads(threads)
        try:
            result.append((True, fn()))
        except BaseException as e:  # raised again on the caller's thread
            result.append((False, e))

    worker = threading.Thread(target=run, name=name)
    worker.start()
    worker.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value
