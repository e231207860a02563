"""Images and videos already seen, by their raw bytes: a follow-up question about the same upload
skips decoding, resizing and hashing and gets the same ProcessedImage (a video: the same frames),
so the same content hashes, the same cached vision embeddings and the same radix-cache prefix.
A video's repeat is where this pays most: its frames are demuxed, decoded and resized again
otherwise (about 14 ms for the benchmarks' 8-frame clip, a tenth of the first forward's time).

A bounded LRU keyed by xxh3_128 of the raw bytes plus everything else that shapes the result: the
processing config and the limits (a hit must not dodge a stricter limit than the one it was
decoded under), and for a video the frame sampling asked for. Bounded by the bytes of pixel_values
it holds. Thread-safe: the engine's media pool calls it from several threads. Each item is processed
once: threads missing on the same key while it is being processed wait for that result (or its
error) instead of decoding it again; `on_process(kind)` is called once per item actually processed
("image" or "video"; the engine counts them in vlserve_media_decodes_total). A video not seen
whole may still share frames with one seen (a grown clip): those come from `frames`
(preprocess/frame_cache.py), so only its new frames are decoded, resized and hashed.
"""

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable

import xxhash
from PIL import Image

from .frame_cache import FrameCache
from .image_loader import decode_image, load_image
from .limits import MediaLimits
from .prepare import ProcessedImage, prepare_video, process_image
from .processing import ImageProcessing
from .sources import MediaSource, read_source_bytes

DEFAULT_MAX_BYTES = 256 * 1024 * 1024  # ~190 images at 336 px (1.35 MB of fp32 pixels each)


class ProcessedImageCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, on_process: Callable[[str], None] | None = None,
                 frames: FrameCache | None = None):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes, self.on_process = max_bytes, on_process
        self.frames = FrameCache() if frames is None else frames  # a new clip's frames an earlier clip had
        self._in_flight: dict[tuple, Future] = {}  # keys being processed now, by the thread that missed first
        # an image's entry is its ProcessedImage; a video's, the tuple of its frames'
        self._entries: OrderedDict[tuple, ProcessedImage | tuple[ProcessedImage, ...]] = OrderedDict()
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
        return self._once(key, "image", lambda: process_image(decode_image(data, limits), processing))

    def prepare_video(self, source: MediaSource, processing, limits: MediaLimits = MediaLimits(),
                      num_frames: int | None = None, fps: float | None = None,
                      max_frames: int | None = None) -> list[ProcessedImage]:
        """Same result as preprocess.prepare_video; decodes only bytes not seen recently with the same
        frame sampling."""
        data = read_source_bytes(source, limits, "video_max_bytes", "video")
        key = ("video", xxhash.xxh3_128_digest(data), len(data), processing, limits, num_frames, fps, max_frames)
        return list(self._once(key, "video",
                               lambda: tuple(prepare_video(data, processing, limits, num_frames, fps, max_frames,
                                                                     self.frames))))

    def _once(self, key: tuple, kind: str, process: Callable[[], ProcessedImage | tuple[ProcessedImage, ...]]):
        """The entry for key: cached, being processed by another thread (wait for it), or processed here."""
        with self._lock:
            found = self._get_locked(key)
            if found is not None:
                return found
            flight = self._in_flight.get(key)
            leader = flight is None
            if leader:
                flight = self._in_flight[key] = Future()
        if not leader:
            return flight.result()  # the leader's result, or its MediaError raised here too
        try:
            entry = process()
            if self.on_process is not None:
                self.on_process(kind)
            self.put(key, entry)
            flight.set_result(entry)
            return entry
        except BaseException as e:
            flight.set_exception(e)
            raise
        finally:
            with self._lock:
                del self._in_flight[key]

    def get(self, key: tuple) -> ProcessedImage | tuple[ProcessedImage, ...] | None:
        with self._lock:
            return self._get_locked(key)

    def _get_locked(self, key: tuple) -> ProcessedImage | tuple[ProcessedImage, ...] | None:
        image = self._entries.get(key)
        if image is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return image

    def put(self, key: tuple, entry: ProcessedImage | tuple[ProcessedImage, ...]) -> None:
        images = entry if isinstance(entry, tuple) else (entry,)
        size = _nbytes(entry)
        if size > self.max_bytes:
            return  # larger than the whole budget: never cached
        for image in images:
            image.pixel_values.setflags(write=False)  # shared by every later hit
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= _nbytes(old)
            self._entries[key] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= _nbytes(evicted)

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


def _nbytes(entry: ProcessedImage | tuple[ProcessedImage, ...]) -> int:
    images = entry if isinstance(entry, tuple) else (entry,)
    return sum(image.pixel_values.nbytes for image in images)
