"""The scheduling loop: one background thread that owns the scheduler and the runner.

Each iteration takes the requests handed in since the last one, then runs one step:
schedule → run → process. Nothing else runs on this thread; nothing else touches the
scheduler's queues (submissions and aborts cross over through thread-safe queues).

Admission (`--max-queued-requests`): a request is queued from its submission until admission
moves it to the running batch, first in the inbox, then in the scheduler's waiting queue. submit
counts both under one lock, which the loop also holds while it moves the inbox into the waiting
queue, so a burst of concurrent submissions never queues more than the limit. (The waiting queue
only shrinks outside the lock: a submission may then see a count a little high, never low.)
"""

import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable

from vlserve.core.errors import EngineBusy
from vlserve.core.request import Req
from vlserve.engine.compute_thread import ComputeThread
from vlserve.runner.model_runner import ModelRunner
from vlserve.scheduler.scheduler import Scheduler



def step(scheduler: Scheduler, runner: ModelRunner, gate: Callable[[], object] | None = None) -> None:
    """One scheduling step. `gate`, where given, is called before each forward (on this thread)."""
    plan = scheduler.schedule()
    if not plan:
        return
    if gate is not None:
        gate()
    try:
        result = runner.run(plan)
    except Exception as e:  # a bug must fail the batch's requests, never the engine
        scheduler.fail(plan, e)
        return
    scheduler.process(result)


class EngineLoop:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, after_step: Callable[[], object] | None = None,
                 thread: ComputeThread | None = None, step_gate: Callable[[], object] | None = None):
        """`thread`: the engine's compute thread, which built the model (compute_thread.py); the loop
        runs on it from start() on. Without one the loop gets a thread of its own. `step_gate`: called
        on the loop thread before each forward; a test holds or paces the loop with it (read every
        step, so it may be set after start)."""
        self.scheduler, self.runner, self.after_step = scheduler, runner, after_step
        self.step_gate = step_gate
        self._inbox: queue.Queue[list[Req]] = queue.Queue()
        self._inbox_requests = 0  # requests in _inbox; read and written under _admission
        self._admission = threading.Lock()
        self._calls: queue.SimpleQueue[tuple[Callable, Future]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self.heartbeat = time.monotonic()  # written every iteration; read by /health
        self._thread = thread or ComputeThread("vlserve-engine")
        self._started = False

    def start(self) -> None:
        self._started = True
        self._thread.hand_over(self._run)

    def submit(self, reqs: list[Req], max_queued: int | None = None) -> None:
        """Thread-safe: the requests join the waiting queue together (so the policy orders them together).
        Raises EngineBusy, queueing none of them, when that would put more than max_queued requests
        in the inbox and the waiting queue together."""
        with self._admission:
            queued = self._inbox_requests + len(self.scheduler.waiting)
            if max_queued is not None and queued + len(reqs) > max_queued:
                raise EngineBusy(f"the waiting queue is full ({max_queued} requests)")
            self._inbox_requests += len(reqs)
            self._inbox.put(reqs)

    @property
    def queued(self) -> int:
        """Requests submitted and not yet admitted into the running batch."""
        with self._admission:
            return self._inbox_requests + len(self.scheduler.waiting)

    def call(self, fn: Callable[[], object]) -> Future:
        """Runs fn on the loop thread between two steps (it may touch the scheduler and the cache)."""
        future: Future = Future()
        self._calls.put((fn, future))
        return future

    @property
    def idle(self) -> bool:
        return self.scheduler.idle and self._inbox.empty()

    def is_alive(self, max_stall_s: float) -> bool:
        return (self.running and not self._stop.is_set()
                and time.monotonic() - self.heartbeat < max_stall_s)

    @property
    def running(self) -> bool:
        return self._started and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if not self._started:  # the thread still waits for its last job
            self._started = True
            self._thread.hand_over(lambda: None)
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.heartbeat = time.monotonic()
            self._run_calls()
            self._drain_inbox(block=self.scheduler.idle)
            try:
                step(self.scheduler, self.runner, self.step_gate)
            except Exception as e:  # a bug in schedule/process: fail what is queued, keep the loop
                self.scheduler.fail_all(e)
            if self.after_step is not None:
                self.after_step()

    def _run_calls(self) -> None:
        while not self._calls.empty():
            fn, future = self._calls.get()
            try:
                future.set_result(fn())
            except Exception as e:
                future.set_exception(e)

    def _drain_inbox(self, block: bool) -> None:
        if block:  # idle: wait for work outside the lock, then take it in under it
            try:
                self._take_in(self._inbox.get(timeout=0.05))
            except queue.Empty:
                return
        while True:
            try:
                batch = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._take_in(batch)

    def _take_in(self, batch: list[Req]) -> None:
        """Inbox → waiting queue, under the admission lock (the requests stay counted once)."""
        with self._admission:
            for req in batch:
                self.scheduler.add(req)
            self._inbox_requests -= len(batch)
