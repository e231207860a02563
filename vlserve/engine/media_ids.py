"""Media ids, as vLLM's chat API has them: a content part may carry a `uuid`; a later part with that
uuid and no data reuses the media.

The store keeps each id's raw bytes (after fetching a URL or decoding base64), so a part that names
the id gets the very bytes the first one sent: the processed-media cache (preprocess/image_cache.py)
then hands back the same pixels with the same content hashes, so the same radix keys and cached KV,
and an evicted entry is simply processed again from the bytes, to the same result. An id is scoped
to the API key the request was authorized with (the server when it has none): one client cannot
read another's media by guessing its id. Bounded: an LRU over the bytes it holds; an id evicted is
unknown again (a 400 naming it; the client sends the data with it once more).
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass

from vlserve.core.errors import InvalidRequest
from vlserve.preprocess import MediaLimits, read_source_bytes

DEFAULT_MAX_BYTES = 512 * 1024 * 1024
MAX_UUID_CHARS = 256

_LIMIT_NAMES = {"image": "max_image_bytes", "video": "video_max_bytes"}


@dataclass(frozen=True)
class MediaRef:
    """One media item of a request: its data (any source read_source_bytes takes), its uuid, or both."""
    data: object = None
    uuid: str | None = None


class MediaIdStore:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str, str], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def resolve(self, item, kind: str, scope: str, limits: MediaLimits):
        """The source to process for one item: a plain source as it is; a MediaRef's bytes (remembered
        under its uuid when it has data, looked up when it has none)."""
        if not isinstance(item, MediaRef):
            return item
        if item.uuid is not None and not (isinstance(item.uuid, str) and 0 < len(item.uuid) <= MAX_UUID_CHARS):
            raise InvalidRequest(f"a media uuid must be a string of 1 to {MAX_UUID_CHARS} characters", param="uuid")
        if item.data is None:
            if item.uuid is None:
                raise InvalidRequest(f"an {kind} part needs its data or a uuid sent before", param="uuid")
            return self.lookup(scope, kind, item.uuid)
        data = read_source_bytes(item.data, limits, _LIMIT_NAMES[kind], kind)
        if item.uuid is not None:
            self._remember((scope, kind, item.uuid), data)
        return data

    def lookup(self, scope: str, kind: str, uuid: str) -> bytes:
        """The bytes remembered under uuid in scope; InvalidRequest naming the uuid where there are none."""
        key = (scope, kind, uuid)
        with self._lock:
            data = self._entries.get(key)
            if data is not None:
                self._entries.move_to_end(key)
                return data
        raise InvalidRequest(f"unknown {kind} uuid {uuid!r}: no {kind} was sent with it (or it was evicted); "
                             "send the data with the uuid", param="uuid")

    def _remember(self, key: tuple[str, str, str], data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._entries[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted)

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
