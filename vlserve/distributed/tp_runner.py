"""Rank 0's model runner under tensor parallelism: before each forward it broadcasts the step
(distributed/step_message.py), then runs its own share of the forward; the collectives inside the
model line the ranks up, and the LM head's logits arrive on rank 0, which alone samples.

A forward that fails once the step is broadcast leaves the ranks out of step with each other, so
any such failure is fatal to the group: it is reported once (`on_fatal`) and every later step
fails at once with the same message.
"""

import time
from typing import Callable

import torch

from vlserve.cache.vision_cache import VisionEmbeddingCache
from vlserve.core.forward_batch import ForwardBatch
from vlserve.core.step import PlannedExtend, StepResult
from vlserve.distributed.step_message import ImagePiece, NewImages, StepMessage, VisionOp, broadcast
from vlserve.runner.image_embedder import ImageEmbedder
from vlserve.runner.model_runner import ModelRunner


class TensorParallelError(RuntimeError):
    """The tensor-parallel group is broken (a rank died or a collective failed)."""


class RecordingVisionCache(VisionEmbeddingCache):
    """Rank 0's vision cache: also logs its hits, puts and clears for the other ranks to replay."""

    def __init__(self, capacity_mb: float):
        super().__init__(capacity_mb)
        self.ops: list[VisionOp] = []

    def get(self, content_hash: bytes) -> torch.Tensor | None:
        emb = super().get(content_hash)
        if emb is not None:
            self.ops.append(("get", content_hash))
        return emb

    def put(self, content_hash: bytes, embedding: torch.Tensor) -> None:
        self.ops.append(("put", content_hash))  # replayed even when refused: the worker refuses it too
        super().put(content_hash, embedding)

    def clear(self) -> None:
        self.ops.append(("clear", None))
        super().clear()


class TensorParallelRunner(ModelRunner):
    def __init__(self, *args, dead_rank: Callable[[], str | None], on_fatal: Callable[[str], None], **kwargs):
        """dead_rank(): a sentence naming a rank process that has exited, or None."""
        super().__init__(*args, **kwargs)
        self.cache = RecordingVisionCache(self.embedder.cache.capacity_bytes / (1 << 20))
        self.embedder.cache = self.cache
        self.dead_rank, self.on_fatal = dead_rank, on_fatal
        self.failure: str | None = None
        self._encoded = NewImages()  # what rank 0 encoded since the last broadcast
        self._pieces: list[ImagePiece] = []

    def run(self, plan: list[PlannedExtend]) -> StepResult:
        self._pieces = [(span.content_hash, lo - span.start, hi - span.start) for p in plan if p.req.images
                        for span, lo, hi in ImageEmbedder.overlaps(p.req, p.req.kv_len, p.req.kv_len + p.num_tokens)]
        return super().run(plan)

    def encode_images(self, pixel_values: list[torch.Tensor], image_sizes: list | None = None,
                      roles: list[str] | None = None) -> list[torch.Tensor]:
        self._encoded.add(pixel_values, image_sizes, roles)
        return super().encode_images(pixel_values, image_sizes, roles)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.failure is not None:
            raise TensorParallelError(self.failure)
        msg = StepMessage.of(batch, self._take_ops(), self._encoded, self._pieces)
        self._encoded = NewImages()
        try:
            broadcast(msg)
            return super().forward(batch)
        except Exception as e:
            self.fail(self._why(e))
            raise TensorParallelError(self.failure) from e

    def _take_ops(self) -> list[VisionOp]:
        ops, self.cache.ops = self.cache.ops, []
        return ops

    def _why(self, error: Exception, wait_s: float = 2.0) -> str:
        """A dead rank explains a failed collective better than the collective's own error: look for one."""
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            dead = self.dead_rank()
            if dead:
                return dead
            time.sleep(0.05)
        return f"tensor parallelism: a step failed and the ranks are out of step ({type(error).__name__}: {error})"

    def fail(self, why: str) -> None:
        """Marks the group broken (once) and reports it."""
        if self.failure is None:
            self.failure = why
            self.on_fatal(why)
