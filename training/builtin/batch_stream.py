"""Training batches drawn in a child process, in step order, a few steps ahead of the model.

Drawing a batch (rendering pictures, encoding turns, the per-patch and attention targets) takes about
a third of a step on one core. With a second core free, a child process draws batch k+1 while the
parent trains on batch k. The child is forked once the parent has drawn everything else it needs
(the held-out batches, the vision warm-up), so it starts from the very random state the parent would
have had, and the stream is the one the parent would have drawn itself, batch for batch.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class BatchStream:
    """`next(step)` gives the batches of steps 0, 1, 2, ... in order; `cpu_seconds()` is the CPU time the
    child has used so far (as of the last batch taken), for the run's CPU-time log and guard."""

    make_batch: Callable[[int], object]
    ahead: int = 3
    _queue: mp.Queue | None = None
    _child: mp.Process | None = None
    _child_cpu: float = 0.0

    def start(self) -> BatchStream:
        ctx = mp.get_context("fork")  # the child needs the parent's drawing state as it is now
        self._queue = ctx.Queue(maxsize=self.ahead)
        self._child = ctx.Process(target=_draw_forever, args=(self.make_batch, self._queue), daemon=True)
        self._child.start()
        return self

    def next(self, step: int):
        while True:
            try:
                drawn_for, batch, self._child_cpu = self._queue.get(timeout=1.0)
                assert drawn_for == step, f"batch of step {drawn_for} arrived for step {step}"
                return batch
            except queue.Empty:  # make sure the child is still there
                if not self._child.is_alive():
                    raise RuntimeError(f"the batch-drawing process died (exit code {self._child.exitcode})")

    def cpu_seconds(self) -> float:
        return self._child_cpu

    def close(self) -> None:
        if self._child is not None and self._child.is_alive():
            self._child.terminate()
            self._child.join(5)


def _draw_forever(make_batch: Callable[[int], object], queue: mp.Queue) -> None:
    torch.set_num_threads(1)
    step = 0
    while True:
        batch = make_batch(step)
        queue.put((step, batch, time.process_time()))
        step += 1
