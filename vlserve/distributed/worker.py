"""A worker rank (1 .. N-1): joins the group, loads and shards the model, then only executes the
forwards rank 0 broadcasts, until rank 0 says stop or the group breaks. It has no scheduler, no
allocator and no sampler; its KV pool holds its KV heads for the slots rank 0 assigns.
"""

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlserve.cache.vision_cache import VisionEmbeddingCache
from vlserve.cpu.threads import configure_compute_threads
from vlserve.distributed.group import GroupSpec, join, leave
from vlserve.distributed.step_message import image_embeds, receive, replay_vision
from vlserve.core.config import KernelConfig
from vlserve.memory.kv_pool import KVPool
from vlserve.model.attention import AttentionBackend
from vlserve.model.loader import load_model
from vlserve.model.tensor_parallel import TPContext, kv_heads_per_rank, shard_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerConfig:
    """Sent by rank 0 once every rank has joined: what to load and how big the pool is."""
    model_path: str
    dtype: str  # the dtype rank 0 resolved, so every rank runs in the same one
    num_slots: int
    attention_backend: str
    vision_cache_mb: float
    num_threads: int
    kernels: KernelConfig = KernelConfig()  # rank 0's, so every rank takes the same kernel paths


def load_shard(path: str, dtype, device: str, tp: TPContext, kernels: KernelConfig = KernelConfig()):
    """The checkpoint loaded whole, then cut to this rank's share (the full copy is freed)."""
    loaded = load_model(path, dtype=dtype, device=device, kernels=kernels)
    shard_model(loaded.model, tp)
    return loaded


def exchange_ready(error: str | None) -> list[str]:
    """Every rank says whether it loaded; returns the errors of all ranks (empty: all ready)."""
    statuses: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(statuses, error)
    return [s for s in statuses if s]


def worker_main(rank: int, spec: GroupSpec, parent_pid: int | None = None) -> None:
    """The process entry of a worker rank (torch.multiprocessing spawn target)."""
    logging.basicConfig(level="INFO", format=f"%(asctime)s %(levelname)s tp-rank-{rank} %(name)s: %(message)s")
    if parent_pid is not None:
        _exit_with_parent(parent_pid)
    tp = join(spec, rank)
    box = [None]
    dist.broadcast_object_list(box, src=0)
    cfg: WorkerConfig = box[0]
    device = spec.device(rank)
    error, runtime = None, None
    try:
        configure_compute_threads(cfg.num_threads)
        runtime = _WorkerRuntime(cfg, tp, device)
    except Exception as e:  # told to every rank, so rank 0 can say which rank could not start
        log.exception("could not start")
        error = f"tensor-parallel rank {rank}: {type(e).__name__}: {e}"
    if exchange_ready(error):
        leave()
        sys.exit(1)
    try:
        runtime.serve()
    except Exception as e:  # rank 0 gone, a peer gone, a collective timed out, or this forward failed
        log.exception("tensor-parallel rank %d stops: %s", rank, e)
        os._exit(1)  # no teardown through a broken group
    leave()
    logging.shutdown()
    os._exit(0)  # the interpreter's own teardown (library atexit hooks) took seconds, for nothing


class _WorkerRuntime:
    def __init__(self, cfg: WorkerConfig, tp: TPContext, device: str):
        self.loaded = load_shard(cfg.model_path, cfg.dtype, device, tp, cfg.kernels)
        text = self.loaded.config.text
        self.kv = KVPool.create(text.num_layers, cfg.num_slots, kv_heads_per_rank(text.num_kv_heads, tp.size),
                                text.head_dim, self.loaded.config.dtype, device)
        self.attention = AttentionBackend(cfg.attention_backend)
        self.vision_cache = VisionEmbeddingCache(cfg.vision_cache_mb)
        self.device = device

    def serve(self) -> None:
        while (msg := receive()) is not None:
            found = replay_vision(msg, self.vision_cache, self.encode_images)
            batch = msg.forward_batch(image_embeds(msg, found), self.device)
            self.loaded.model(batch, self.kv, self.attention)  # its logits go to rank 0 inside the LM head

    def encode_images(self, pixel_values: list[torch.Tensor], image_sizes: list, roles: list) -> list[torch.Tensor]:
        return self.loaded.model.encode_images([p.to(self.device) for p in pixel_values], image_sizes, roles)


def _exit_with_parent(parent_pid: int) -> None:
    """A worker outlives no parent: if the engine's process is gone (even killed), exit."""
    def watch():
        while True:
            if os.getppid() != parent_pid:
                log.error("the engine process (pid %d) is gone; exiting", parent_pid)
                os._exit(1)
            time.sleep(0.5)
    threading.Thread(target=watch, name="vlserve-tp-parent-watch", daemon=True).start()
