"""Images already seen, by their raw bytes: a follow-up question about the same upload skips
decoding, resizing and hashing and gets the same ProcessedImage (so the same content hash, the
same cached vision embeddings and the same radix-cache prefix).

A bounded LRU keyed by xxh3_128 of the raw bytes plus everything else that shapes the result: the
processing config and the pixel limit (a hit must not dodge a stricter limit than the one it was
decoded under). Bounded by the bytes of pixel_values it holds. Thread-safe: the engine's media
pool calls it from several threads; two threads missing on the same bytes at once both decode, and
the second result simply replaces the first (they are equal).
"""

import threading
from collections import OrderedDict

import xxhash
from PIL import Image

from .image_loader import decode_image, load_image
from .limits import MediaLimits
from .prepare import ProcessedImage, process_image
from .processing import ImageProcessing
from .sources import MediaSource, read_source_bytes

DEFAULT_MAX_BYTES = 256 * 1024 * 1024  # ~190 images at 336 px (1.35 MB of fp32 pixels each)


class ProcessedImageCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, ProcessedImage] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def prepare_image(self, source: MediaSource | Image.Image, processing: ImageProcessing,
                      limits: MediaLimits = MediaLimits()) -> ProcessedImage:
        """Same result as preprocess.prepare_image; decodes only bytes not seen recently. A PIL
        image has no raw bytes to recognise and is always processed."""
        if isinstance(source, Image.Image):
            return process_image(load_image(source, limits), processing)
        data = read_source_bytes(source, limits, "max_image_bytes", "image")
        key = (xxhash.xxh3_128_digest(data), len(data), processing, limits.max_image_pixels)
        found = self.get(key)
        if found is not None:
            return found
        image = process_image(decode_image(data, limits), processing)
        self.put(key, image)
        return image

    def get(self, key: tuple) -> ProcessedImage | None:
        with self._lock:
            image = self._entries.get(key)
            if image is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return image

    def put(self, key: tuple, image: ProcessedImage) -> None:
        size = image.pixel_values.nbytes
        if size > self.max_bytes:
            return  # larger than the whole budget: never cached
        image.pixel_values.setflags(write=False)  # shared by every later hit
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.pixel_values.nbytes
            self._entries[key] = image
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.pixel_values.nbytes

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
