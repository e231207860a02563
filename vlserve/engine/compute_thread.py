"""The one thread that runs an engine's torch work: it loads the model and builds the KV pool, then
becomes the scheduling loop (loop.py).

Why one thread: torch's CPU kernels parallelise with OpenMP, whose runtime (libgomp) keeps a team of
worker threads per thread that ever ran a parallel region. With the model loaded on the caller's
thread and run on the loop's, a 2-core process had two teams: three OpenMP threads on two CPUs,
which libgomp counts as oversubscribed, so its workers stop spinning between parallel regions and
sleep (a futex wake on every region: a hundred a decode step). Loading and running on one thread
left one team: bf16 few-shot decode steps 14-19 -> 12-14 ms and the batch 0.75-0.81 -> 0.62-0.68 s
on two Zen 5 cores (benchmarks/results/compute_thread_tenth.md). The caller's thread should then stay
clear of parallel torch work itself (benchmarks measure their GEMM peak on a thread of its own).
"""

import queue
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


class ComputeThread:
    def __init__(self, name: str):
        self._threads = torch.get_num_threads()  # what the engine configured (cpu/threads.py), set on the thread too
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future | None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[[], T]) -> T:
        """Runs fn on the thread and returns its result (or raises its exception) here."""
        future: Future = Future()
        self._jobs.put((fn, future))
        return future.result()

    def hand_over(self, fn: Callable[[], object]) -> None:
        """The thread's last job: it runs fn (the loop) until fn returns, then ends."""
        self._jobs.put((fn, None))

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _serve(self) -> None:
        torch.set_num_threads(self._threads)  # OpenMP's thread count is per thread: this one's before any kernel
        while True:
            fn, future = self._jobs.get()
            if future is None:
                fn()
                return
            try:
                future.set_result(fn())
            except BaseException as e:  # handed to the caller of run()
                future.set_exception(e)
