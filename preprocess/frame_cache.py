"""Video frames already decoded (and processed), by the chain of compressed packets they decode
from (preprocess/video_packets.py): a follow-up question about a grown clip decodes, resizes and
hashes only its new frames.

Two kinds of entry share one LRU bounded by bytes: a frame processed for the model (its
ProcessedImage, pixel key included), keyed by the processing, the chain and the frame's role (a
pooled video's last frame has one of its own); and, for processings that
take a video's frames together (Qwen-VL's frame pairs), the decoded RGB frame, keyed by the chain.
Thread-safe: the engine's media pool calls it from several threads.
"""

import threading
from collections import OrderedDict
from typing import Callable

from PIL import Image

from .processed import ProcessedImage

DEFAULT_MAX_BYTES = 256 * 1024 * 1024  # ~1,700 CLIP frames at 224 px, or ~40 decoded 1080p frames


class FrameCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, on_reuse: Callable[[int], None] | None = None):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes, self.on_reuse = max_bytes, on_reuse
        self._entries: OrderedDict[tuple, tuple[ProcessedImage | Image.Image, int]] = OrderedDict()  # (entry, bytes)
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def processed(self, processing, chain: bytes, role: str) -> ProcessedImage | None:
        return self._get(("processed", processing, chain, role))

    def put_processed(self, processing, chain: bytes, role: str, image: ProcessedImage) -> None:
        image.pixel_values.setflags(write=False)  # shared by every later hit
        self._put(("processed", processing, chain, role), image, image.pixel_values.nbytes)

    def decoded(self, chain: bytes) -> Image.Image | None:
        return self._get(("decoded", chain))

    def put_decoded(self, chain: bytes, image: Image.Image) -> None:
        self._put(("decoded", chain), image, image.width * image.height * len(image.getbands()))

    def count_reused(self, n: int) -> None:
        if n and self.on_reuse is not None:
            self.on_reuse(n)

    def _get(self, key: tuple):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def _put(self, key: tuple, value, size: int) -> None:
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
