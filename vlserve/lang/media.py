"""Images and videos of a program: read once, at the statement, into bytes (in text order)."""

import base64
import io
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class MediaItem:
    kind: str  # "image" or "video"
    data: bytes
    num_frames: int | None = None  # videos only

    def data_uri(self) -> str:
        mime = _video_mime(self.data) if self.kind == "video" else _image_mime(self.data)
        return f"data:{mime};base64,{base64.b64encode(self.data).decode()}"


def image_item(source) -> MediaItem:
    return MediaItem("image", _bytes_of(source, "image"))


def video_item(source, num_frames: int) -> MediaItem:
    if not isinstance(num_frames, int) or num_frames < 1:
        raise ValueError(f"video num_frames must be a positive integer, got {num_frames!r}")
    return MediaItem("video", _bytes_of(source, "video"), num_frames)


def _bytes_of(source, kind: str) -> bytes:
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return f.read()
    if kind == "image" and hasattr(source, "save"):  # a PIL image
        buf = io.BytesIO()
        source.save(buf, "PNG")
        return buf.getvalue()
    raise TypeError(f"{kind}() takes a path, bytes{' or a PIL image' if kind == 'image' else ''}; "
                    f"got {type(source).__name__}")


def _image_mime(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:3] == b"GIF":
        return "image/gif"
    return "application/octet-stream"


def _video_mime(data: bytes) -> str:
    return "video/x-matroska" if data.startswith(b"\x1a\x45\xdf\xa3") else "video/mp4"
