"""A pool of compile worker processes with a per-compile time limit.

Each of `size` dispatcher threads owns one worker process (compile_worker.py) and feeds it jobs from
one queue; a thread waiting on its worker holds no GIL (it blocks in select), so the engine's loop
and other requests' preprocessing keep running whatever a compile costs. A compile past the time
limit has its worker killed (a running regex → DFA determinisation cannot be interrupted any other
way) and a new one started for the next job. A worker starts with its thread's first job (about
half a second of imports: the worker never imports torch) and then serves job after job.
"""

from __future__ import annotations

import logging
import queue
import select
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass

from vlserve.constrained.byte_compile import ConstraintTooLarge, field_name
from vlserve.constrained.compile_worker import read_frame, write_frame
from vlserve.core.errors import ConstraintError

log = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 120.0  # its imports, on a loaded machine


@dataclass(frozen=True)
class CompileJob:
    kind: str  # "regex" or "json_schema"
    text: str
    max_states: int


class CompileWorkerError(RuntimeError):
    """The worker failed for a reason that is not the constraint's (a bug, a crash at start)."""


class _WorkerProcess:
    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-m", "vlserve.constrained.compile_worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            ready = self._wait(WORKER_START_TIMEOUT_S)
        except Exception:  # it died at start (EOF) or wrote something else
            ready = None
        if ready != ("ready",):
            self.kill()
            raise CompileWorkerError("the grammar compile worker did not start")

    def run(self, job: CompileJob, timeout_s: float):
        """The worker's reply, or None when it took longer than timeout_s."""
        write_frame(self.process.stdin, (job.kind, job.text, job.max_states))
        return self._wait(timeout_s)

    def _wait(self, timeout_s: float):
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        return read_frame(self.process.stdout) if ready else None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()


class CompileWorkers:
    """Threads and processes start with the first job; shutdown() ends them, and a job submitted
    after it starts a fresh set (a stopped engine can still be driven step by step)."""

    def __init__(self, size: int, timeout_s: float):
        if size < 1 or not timeout_s > 0:
            raise ValueError(f"compile workers: size {size} must be >= 1 and the time limit {timeout_s} s > 0")
        self.size, self.timeout_s = size, timeout_s
        self._lock = threading.Lock()
        self._jobs: queue.Queue | None = None  # the running set's queue; None: not running

    def submit(self, job: CompileJob) -> Future:
        """A Future of (regex, ByteDFA); its exception is ConstraintError (the request's fault,
        ConstraintTooLarge past the budget) or CompileWorkerError."""
        future: Future = Future()
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.Queue()
                for i in range(self.size):
                    threading.Thread(target=self._serve, args=(self._jobs,), name=f"vlserve-grammar-{i}",
                                     daemon=True).start()
            self._jobs.put((job, future))
        return future

    def shutdown(self) -> None:
        with self._lock:
            if self._jobs is not None:
                for _ in range(self.size):
                    self._jobs.put(None)
                self._jobs = None

    def _serve(self, jobs: queue.Queue) -> None:
        worker = None  # started with the first job: an engine that never compiles starts no process
        try:
            while (item := jobs.get()) is not None:
                job, future = item
                if not future.set_running_or_notify_cancel():
                    continue
                worker = worker or self._started()
                worker = self._compile(worker, job, future)
        finally:
            if worker is not None:
                worker.kill()

    def _started(self) -> _WorkerProcess | None:
        try:
            return _WorkerProcess()
        except (OSError, EOFError, CompileWorkerError) as e:
            log.error("grammar compile worker: %s", e)
            return None

    def _compile(self, worker: _WorkerProcess | None, job: CompileJob, future: Future) -> _WorkerProcess | None:
        """Runs one job; returns the worker to use next (None: start a new one)."""
        if worker is None:
            future.set_exception(CompileWorkerError("the grammar compile worker could not be started"))
            return None
        try:
            reply = worker.run(job, self.timeout_s)
        except (OSError, EOFError):  # the worker died mid-compile: out of memory, most likely
            worker.kill()
            future.set_exception(ConstraintTooLarge(
                f"{field_name(job.kind)} is too large or too open to compile: the compile ran out of memory",
                "memory"))
            return None
        except Exception as e:  # a garbled reply: the waiters get an error, never a hang
            worker.kill()
            future.set_exception(CompileWorkerError(f"the grammar compile worker failed: {type(e).__name__}: {e}"))
            return None
        if reply is None:
            worker.kill()
            future.set_exception(ConstraintTooLarge(
                f"{field_name(job.kind)} is too large or too open to compile: not compiled within "
                f"{self.timeout_s:g} s (--grammar-compile-timeout)", "timeout"))
            return None
        _settle(future, reply)
        return worker


def _settle(future: Future, reply: tuple) -> None:
    status = reply[0]
    if status == "ok":
        future.set_result(reply[1])
    elif status == "too_large":
        future.set_exception(ConstraintTooLarge(reply[1], reply[2]))
    elif status == "invalid":
        future.set_exception(ConstraintError(reply[1]))
    else:
        future.set_exception(CompileWorkerError(f"the grammar compile worker failed: {reply[1]}"))
