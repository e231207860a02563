"""At start, touch the memory the first big forwards will write, so that they do not fault it in.

The first write to a fresh page of anonymous memory faults, and the kernel zeroes the page. On the
VMs measured here (kernel 6.18.44-fc guests) a first touch costs ~0.85 s per GB, 16x a second write
over the same pages. Unprefaulted, a fresh engine's first large batch pays that in its serving path: few_shot's
timed batch (bf16, after a two-token warm-up) took 10.9 K minor faults, 7.4 K of them the heap
growing to hold a 1,334-row prefill's activations and 3.5 K its KV slots' pages; video_qa 25-31 K.

So the engine, on the CPU, touches two bounded regions before it serves:
- the heap: one block the size of a chunk's activations (`activation_bytes`), written and freed.
  With allocator.keep_freed_memory in force glibc keeps it, and later activations reuse its pages;
- the KV pool's first PREFAULT_KV_CHUNKS chunks of slots in every layer: the slot allocator hands out
  the lowest free slots first, so they are the first requests' (the rest of a large pool stays
  untouched and costs no resident memory, as kv_pool.py intends).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vlserve.cpu.allocator import KEEP_BELOW, keep_freed_memory

if TYPE_CHECKING:  # only named in annotations: this package sits below memory/ and model/
    from vlserve.memory.kv_pool import KVPool
    from vlserve.model.config import TextConfig

PREFAULT_KV_CHUNKS = 4  # chunks of slots touched in every layer's K and V at start
ACTIVATION_MARGIN = 2  # the block is this many times one chunk's largest live activations


def activation_bytes(text: TextConfig, rows: int, element_size: int) -> int:
    """About the largest live activations of a forward of `rows` tokens: the residual stream and the
    normed input (2 x hidden), q/k/v and the attention output (2 q + 2 kv), the MLP's gate-up output
    and its product (3 x intermediate); times ACTIVATION_MARGIN for the kernels' scratch and the
    allocator's slack."""
    q, kv = text.num_heads * text.head_dim, text.num_kv_heads * text.head_dim
    per_row = 2 * text.hidden_size + 2 * q + 2 * kv + 3 * text.intermediate_size
    return ACTIVATION_MARGIN * rows * per_row * element_size


def prefault_heap(nbytes: int) -> int:
    """Writes and frees a heap block of nbytes (capped below glibc's mapping threshold, where a block
    would be unmapped on free); returns the bytes touched, 0 where freed memory is not kept."""
    nbytes = min(nbytes, KEEP_BELOW // 2)
    if nbytes <= 0 or not keep_freed_memory():
        return 0
    block = torch.empty(nbytes, dtype=torch.uint8)
    block.zero_()
    del block
    return nbytes


def prefault_kv(kv: KVPool, slots: int) -> int:
    """Zeroes the first `slots` slots of every layer's K and V buffers (CPU only); returns bytes."""
    touched = 0
    for buf in kv.k_buffers + kv.v_buffers:
        if buf.is_cpu:
            part = buf[:slots]
            part.zero_()
            touched += part.numel() * part.element_size()
    return touched


def prefault_for_serving(text: TextConfig, kv: KVPool, chunk_rows: int, element_size: int) -> tuple[int, int]:
    """Both regions for an engine whose prefills run in chunks of chunk_rows; (heap, kv) bytes."""
    heap = prefault_heap(activation_bytes(text, chunk_rows, element_size))
    return heap, prefault_kv(kv, PREFAULT_KV_CHUNKS * chunk_rows)
