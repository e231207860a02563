"""What rank 0 sends the other ranks each step, and the forward batch they rebuild from it.

The scheduler, radix tree, allocator and req_to_token table exist on rank 0 only. A worker rank
needs just what its forward reads: the batch's index tensors, the req_to_token rows of this step's
requests (sent compact: row i of the message is request i's row, up to the longest length), and the
image embeddings. Those it computes itself with its own copy of the vision tower: the message
carries the pixels of the images rank 0 encoded this step (new images only) and the operations
rank 0 did on its vision-embedding cache since the last message, which the worker replays on a
cache of the same size, so the two caches hold the same entries (the invariant: a hash rank 0 read
from its cache is in the worker's).

Cost: the rows are sent whole every step (4 bytes per token of context per request: 2 MB for 128
requests of 4k tokens), which spares the workers a mirror of the table that every admission, cache
hit, retraction and jump-forward would have to keep in step. One pickled object per step
(broadcast_object_list), tensors on the CPU.
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from vlserve.cache.vision_cache import VisionEmbeddingCache
from vlserve.core.forward_batch import ForwardBatch, ForwardMode

@dataclass
class NewImages:
    """The images rank 0 encoded (its vision-cache misses), in the order of its "put" operations:
    pixels ([3, H, W], or [views, 3, H, W] for anyres), original sizes and roles, as the tower takes them."""
    pixels: list[torch.Tensor] = field(default_factory=list)
    sizes: list = field(default_factory=list)
    roles: list = field(default_factory=list)

    def add(self, pixels: list[torch.Tensor], sizes: list | None, roles: list | None) -> None:
        self.pixels += [p.cpu() for p in pixels]
        self.sizes += sizes or [None] * len(pixels)
        self.roles += roles or [None] * len(pixels)


VisionOp = tuple[str, bytes | None]  # ("get", hash) of a hit, ("put", hash) of an encoded image, ("clear", None)
ImagePiece = tuple[bytes, int, int]  # rows lo:hi of one image's embedding, in the batch's image-row order


@dataclass
class StepMessage:
    mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    extend_lens: torch.Tensor
    qo_start_loc: torch.Tensor
    logits_rows: torch.Tensor
    rows: torch.Tensor  # [B, max(seq_lens)] the step's req_to_token rows
    image_mask: torch.Tensor | None = None
    vision_ops: list[VisionOp] = field(default_factory=list)
    new_images: NewImages = field(default_factory=NewImages)  # the images of the "put" ops, in order
    image_pieces: list[ImagePiece] = field(default_factory=list)

    @classmethod
    def of(cls, batch: ForwardBatch, vision_ops: list[VisionOp], new_images: NewImages,
           image_pieces: list[ImagePiece]) -> "StepMessage":
        longest = int(batch.seq_lens.max())
        rows = batch.req_to_token[batch.req_pool_indices, :longest]
        cpu = lambda t: None if t is None else t.cpu()  # noqa: E731 (pickled: no device tensors)
        return cls(batch.mode, cpu(batch.input_ids), cpu(batch.positions), cpu(batch.out_cache_loc),
                   cpu(batch.seq_lens), cpu(batch.extend_lens), cpu(batch.qo_start_loc), cpu(batch.logits_rows),
                   cpu(rows), cpu(batch.image_mask), vision_ops, new_images, image_pieces)

    def forward_batch(self, image_embeds: torch.Tensor | None, device: str) -> ForwardBatch:
        to = lambda t: None if t is None else t.to(device)  # noqa: E731
        return ForwardBatch(
            mode=self.mode, input_ids=to(self.input_ids), positions=to(self.positions),
            out_cache_loc=to(self.out_cache_loc),
            req_pool_indices=torch.arange(self.rows.shape[0], dtype=torch.int64, device=device),
            seq_lens=to(self.seq_lens), extend_lens=to(self.extend_lens), qo_start_loc=to(self.qo_start_loc),
            req_to_token=to(self.rows), logits_rows=to(self.logits_rows), image_mask=to(self.image_mask),
            image_embeds=to(image_embeds))


def replay_vision(msg: StepMessage, cache: VisionEmbeddingCache, encode) -> dict[bytes, torch.Tensor]:
    """Applies rank 0's cache operations to this rank's cache; returns the embeddings the step reads."""
    new = msg.new_images
    encoded = iter(encode(new.pixels, new.sizes, new.roles) if new.pixels else ())
    found = {}
    for op, content_hash in msg.vision_ops:
        if op == "clear":
            cache.clear()
        elif op == "get":
            emb = cache.get(content_hash)
            if emb is None:
                raise RuntimeError("tensor parallelism: this rank's vision cache lost an entry rank 0 still has")
            found[content_hash] = emb
        else:
            found[content_hash] = emb = next(encoded)
            cache.put(content_hash, emb)
    return found


def image_embeds(msg: StepMessage, found: dict[bytes, torch.Tensor]) -> torch.Tensor | None:
    """The batch's image rows in order (rank 0 read every image it uses this step: a hit or a put)."""
    if not msg.image_pieces:
        return None
    return torch.cat([found[content_hash][lo:hi] for content_hash, lo, hi in msg.image_pieces])


def broadcast(msg: StepMessage | None) -> None:
    """Rank 0's side; None tells the workers to stop."""
    dist.broadcast_object_list([msg], src=0)


def receive() -> StepMessage | None:
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
