"""Starting, watching and stopping the ranks of one machine.

Node 0 runs the engine as rank 0 and spawns ranks 1 .. k-1 (k = tp_size / nnodes) as worker
processes; node n > 0 (`vlserve serve --node-rank n`) spawns ranks n*k .. n*k+k-1 and serves no
HTTP. A watchdog thread polls the spawned processes: one that exits while the group runs is
reported once with its rank, pid and exit code or signal (the engine then fails its requests and
the server stops), so a dead rank never leaves the others waiting. Workers exit by themselves when
their parent process disappears (distributed/worker.py).
"""

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch.multiprocessing as mp

from vlserve.cpu.threads import usable_cores
from vlserve.distributed.group import GroupSpec, default_backend, join, leave, resolve_init_addr
from vlserve.distributed.step_message import broadcast
from vlserve.distributed.worker import WorkerConfig, exchange_ready, worker_main
from vlserve.model.tensor_parallel import TPContext, shard_model

log = logging.getLogger(__name__)

POLL_S = 0.2


def ranks_per_node(tp_size: int, nnodes: int) -> int:
    return tp_size // nnodes


def threads_per_rank(tp_size: int, nnodes: int) -> int:
    """On the CPU the ranks of one machine share its cores."""
    return max(1, usable_cores() // ranks_per_node(tp_size, nnodes))


def group_spec(tp_size: int, nnodes: int, dist_init_addr: str | None, device: str | None) -> GroupSpec:
    return GroupSpec(resolve_init_addr(dist_init_addr, nnodes), tp_size, default_backend(device),
                     ranks_per_node(tp_size, nnodes))


def spawn_ranks(spec: GroupSpec, ranks: range) -> dict[int, mp.Process]:
    ctx = mp.get_context("spawn")
    procs = {}
    for rank in ranks:
        p = ctx.Process(target=worker_main, args=(rank, spec, os.getpid()), name=f"vlserve-tp-rank-{rank}", daemon=True)
        p.start()
        procs[rank] = p
    return procs


def dead_rank(procs: dict[int, mp.Process]) -> str | None:
    """A sentence naming the first spawned rank that has exited, or None."""
    for rank, p in procs.items():
        code = p.exitcode
        if code is not None:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            return f"tensor-parallel rank {rank} (pid {p.pid}) {how}"
    return None


def end_processes(procs: dict[int, mp.Process], grace_s: float = 10.0) -> None:
    """Waits up to grace_s for each to exit, then terminates, then kills what is left."""
    end = time.monotonic() + grace_s
    for p in procs.values():
        p.join(max(0.0, end - time.monotonic()))
    for p in procs.values():
        if p.is_alive():
            p.terminate()
            p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


@dataclass
class Watchdog:
    procs: dict[int, mp.Process]
    on_dead: Callable[[str], None]
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._watch, name="vlserve-tp-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            dead = dead_rank(self.procs)
            if dead:
                self.on_dead(dead)
                return


@dataclass
class TensorParallelGroup:
    """Rank 0's handle on the group: its context, this machine's worker processes, the watchdog."""
    tp: TPContext
    procs: dict[int, mp.Process]
    watchdog: Watchdog | None = None
    broken: bool = False

    @classmethod
    def start(cls, spec: GroupSpec, loaded, config: WorkerConfig) -> "TensorParallelGroup":
        """Spawns this machine's other ranks, forms the group, shards rank 0's model (in place) and
        waits until every rank has loaded its share. Raises RuntimeError naming a rank that failed."""
        procs = spawn_ranks(spec, range(1, spec.ranks_per_node))
        try:
            tp = _join_watching(spec, procs)
            broadcast_config(config)
            error = None
            try:
                shard_model(loaded.model, tp)
            except Exception as e:
                error = f"tensor-parallel rank 0: {type(e).__name__}: {e}"
            try:
                errors = exchange_ready(error)
            except Exception as e:
                raise RuntimeError(dead_rank(procs) or f"tensor parallelism could not start: {e}") from e
            if errors:
                raise RuntimeError("tensor parallelism could not start: " + "; ".join(errors))
        except BaseException:
            end_processes(procs, grace_s=5)
            raise
        return cls(tp, procs)

    def watch(self, on_dead: Callable[[str], None]) -> None:
        """Starts the watchdog (once the engine can take the report)."""
        self.watchdog = Watchdog(self.procs, on_dead)
        self.watchdog.start()

    def dead_rank(self) -> str | None:
        return dead_rank(self.procs)

    def stop(self, tell_workers: bool = True) -> None:
        """tell_workers: the loop thread is stopped, so this thread may use the group to say stop."""
        if self.watchdog is not None:
            self.watchdog.stop()
        healthy = not self.broken and self.dead_rank() is None
        if tell_workers and healthy:
            try:
                broadcast(None)
            except Exception as e:
                log.warning("could not tell the tensor-parallel workers to stop (%s); ending them", e)
                healthy = False
        end_processes(self.procs, grace_s=10 if healthy else 0)
        leave()  # local (gloo closes its connections): safe with dead peers, and lets a later engine form a group


def broadcast_config(config: WorkerConfig) -> None:
    import torch.distributed as dist

    dist.broadcast_object_list([config], src=0)


def _join_watching(spec: GroupSpec, procs: dict[int, mp.Process]) -> TPContext:
    """Joins as rank 0 while watching the spawned ranks: one that dies before joining is named at once
    instead of leaving rank 0 waiting for the join's timeout."""
    result: dict = {}

    def run():
        try:
            result["tp"] = join(spec, 0)
        except BaseException as e:
            result["error"] = e

    thread = threading.Thread(target=run, name="vlserve-tp-join", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(POLL_S)
        dead = dead_rank(procs)
        if dead and thread.is_alive():
            raise RuntimeError(f"{dead} before the tensor-parallel group formed")
    if "error" in result:
        raise RuntimeError(f"tensor parallelism: the group at {spec.init_addr} did not form: {result['error']}")
    return result["tp"]


def run_worker_node(tp_size: int, nnodes: int, node_rank: int, dist_init_addr: str | None,
                    device: str | None) -> int:
    """`vlserve serve --node-rank N` (N > 0): this machine's ranks, until they exit; 1 if one failed."""
    spec = group_spec(tp_size, nnodes, dist_init_addr, device)
    first = node_rank * spec.ranks_per_node
    procs = spawn_ranks(spec, range(first, first + spec.ranks_per_node))
    log.info("node %d: tensor-parallel ranks %d..%d joining %s", node_rank, first, first + spec.ranks_per_node - 1,
             spec.init_addr)
    try:
        while any(p.is_alive() for p in procs.values()):
            time.sleep(POLL_S)
            if any(p.exitcode not in (None, 0) for p in procs.values()):
                log.error("%s; stopping this node's ranks", dead_rank(procs))
                end_processes(procs, grace_s=0)
                return 1
    finally:
        end_processes(procs, grace_s=0)
    return 0
