"""Joining the tensor-parallel process group: address, backend, device, timeout.

Ranks meet over TCP at `--dist-init-addr HOST:PORT` (SGLang's name), else at MASTER_ADDR /
MASTER_PORT from the environment, else (one machine) at 127.0.0.1 on a free port rank 0 picks.
gloo on the CPU, NCCL on GPUs. Every collective has a timeout, so a rank that stops answering
fails the others instead of hanging them.
"""

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlserve.model.tensor_parallel import TPContext

# A step's collectives wait at most this long for a peer (a long prefill on a slow rank included).
COLLECTIVE_TIMEOUT_S = float(os.environ.get("VLSERVE_TP_TIMEOUT", "600"))


@dataclass(frozen=True)
class GroupSpec:
    """What every rank needs to join: the meeting address, the group size, the backend."""
    init_addr: str  # host:port
    world_size: int
    backend: str  # "gloo" or "nccl"
    ranks_per_node: int

    def device(self, rank: int) -> str:
        """cpu, or this rank's GPU on its machine (local rank)."""
        return f"cuda:{rank % self.ranks_per_node}" if self.backend == "nccl" else "cpu"


def resolve_init_addr(dist_init_addr: str | None, nnodes: int) -> str:
    if dist_init_addr:
        return dist_init_addr
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    if nnodes > 1:
        raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT (or MASTER_ADDR and MASTER_PORT) "
                         "naming node 0, the same on every node")
    return f"127.0.0.1:{free_port()}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend(device: str | None) -> str:
    on_gpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    return "nccl" if on_gpu else "gloo"


def join(spec: GroupSpec, rank: int) -> TPContext:
    """Blocks until every rank has joined (or the timeout passes)."""
    if spec.backend == "nccl":
        torch.cuda.set_device(spec.device(rank))
    dist.init_process_group(spec.backend, init_method=f"tcp://{spec.init_addr}", rank=rank,
                            world_size=spec.world_size,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return TPContext(rank, spec.world_size, None)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
