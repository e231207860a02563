"""LRU cache of vision-tower outputs keyed by image content hash, bounded in megabytes.

The same image after a different prefix (so its KV is not reusable) still skips the vision tower.
"""

from collections import OrderedDict

import torch


class VisionEmbeddingCache:
    def __init__(self, capacity_mb: float):
        self.capacity_bytes = int(capacity_mb * (1 << 20))
        self._entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.size_bytes = 0

    def get(self, content_hash: bytes) -> torch.Tensor | None:
        emb = self._entries.get(content_hash)
        if emb is not None:
            self._entries.move_to_end(content_hash)
        return emb

    def put(self, content_hash: bytes, embedding: torch.Tensor) -> None:
        nbytes = embedding.numel() * embedding.element_size()
        if nbytes > self.capacity_bytes or content_hash in self._entries:
            return
        self._entries[content_hash] = embedding
        self.size_bytes += nbytes
        while self.size_bytes > self.capacity_bytes:
            _, old = self._entries.popitem(last=False)
            self.size_bytes -= old.numel() * old.element_size()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.size_bytes = 0
