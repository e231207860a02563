"""Turn a media source (raw bytes, data URI, base64, local path, http(s) URL) into bytes, under the limits.

A string is read as: `data:` URI; `http://` / `https://` URL; `file://` path; a path when it names an
existing file under allowed_media_path; otherwise standard base64 if it uses only the base64 alphabet;
otherwise a path (which then fails with a message saying why).
"""

import base64
import binascii
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from .errors import MediaError
from .limits import MediaLimits, check_over
from .url_guard import guarded_opener

MediaSource = bytes | bytearray | memoryview | str | os.PathLike

_BASE64_CHARS = re.compile(r"[A-Za-z0-9+/=\s]+")
_URL_CHUNK = 64 * 1024


def read_source_bytes(source: MediaSource, limits: MediaLimits, limit_name: str, what: str) -> bytes:
    """Bytes of `source`, at most getattr(limits, limit_name) of them. `what` is "image" or "video"."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, os.PathLike):
        data = _read_path(os.fspath(source), limits, limit_name, what)
    elif isinstance(source, str):
        data = _read_string(source, limits, limit_name, what)
    else:
        raise MediaError(f"unsupported {what} source of type {type(source).__name__}; "
                         "give bytes, a data URI, base64, a local path or a URL")
    check_over(what, len(data), "bytes", limits, limit_name)
    if not data:
        raise MediaError(f"{what} is empty (0 bytes)")
    return data


def _read_string(text: str, limits: MediaLimits, limit_name: str, what: str) -> bytes:
    head = text[:16].lower()
    if head.startswith("data:"):
        return _decode_data_uri(text, limits, limit_name, what)
    if head.startswith(("http://", "https://")):
        return fetch_url(text, limits, limit_name, what)
    if head.startswith("file://"):
        return _read_path(text[len("file://"):], limits, limit_name, what)
    if _is_allowed_file(text, limits):
        return _read_path(text, limits, limit_name, what)
    if _BASE64_CHARS.fullmatch(text):
        return decode_base64(text, limits, limit_name, what)
    return _read_path(text, limits, limit_name, what)


def _decode_data_uri(uri: str, limits: MediaLimits, limit_name: str, what: str) -> bytes:
    header, sep, payload = uri.partition(",")
    if not sep:
        raise MediaError(f"{what} data URI has no ',' separating header and data")
    if not header.lower().endswith(";base64"):
        raise MediaError(f"{what} data URI must be base64-encoded (data:<type>;base64,<data>)")
    return decode_base64(payload, limits, limit_name, what)


def decode_base64(text: str, limits: MediaLimits, limit_name: str, what: str) -> bytes:
    compact = "".join(text.split())
    # Reject an oversized payload from its encoded length, before allocating the decoded bytes.
    decoded_len = len(compact) * 3 // 4 - (len(compact) - len(compact.rstrip("=")))
    check_over(what, decoded_len, "bytes", limits, limit_name)
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaError(f"{what} is not valid base64 ({e})") from None


def _allowed_root(limits: MediaLimits, what: str) -> Path:
    if limits.allowed_media_path is None:
        raise MediaError(f"local {what} paths are disabled (allowed_media_path is not set)")
    root = Path(limits.allowed_media_path).resolve()
    if not root.is_dir():
        raise MediaError(f"allowed_media_path={limits.allowed_media_path!r} is not a directory")
    return root


def resolve_allowed_path(path: str, limits: MediaLimits, what: str) -> Path:
    """The real path of `path` (relative paths are taken under the root), which must lie under allowed_media_path."""
    root = _allowed_root(limits, what)
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = root / candidate
    # Containment is checked on the resolved path (symlinks and '..' followed) BEFORE existence,
    # so a request cannot learn whether files outside the root exist.
    real = candidate.resolve()
    if not real.is_relative_to(root):
        raise MediaError(f"{what} path {path!r} is outside allowed_media_path={limits.allowed_media_path!r}")
    if not real.is_file():
        raise MediaError(f"{what} file {path!r} not found under allowed_media_path")
    return real


def _is_allowed_file(text: str, limits: MediaLimits) -> bool:
    if limits.allowed_media_path is None or len(text) > 4096 or "\0" in text:
        return False
    try:
        resolve_allowed_path(text, limits, "media")
    except (MediaError, OSError):
        return False
    return True


def _read_path(path: str, limits: MediaLimits, limit_name: str, what: str) -> bytes:
    real = resolve_allowed_path(path, limits, what)
    limit = getattr(limits, limit_name)
    try:
        check_over(what, real.stat().st_size, "bytes", limits, limit_name, detail=f"file {path!r}")
        with open(real, "rb") as f:
            return f.read(limit + 1)
    except OSError as e:
        raise MediaError(f"cannot read {what} file {path!r}: {e.strerror or e}") from None


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if not newurl.lower().startswith(("http://", "https://")):
            raise MediaError("URL redirect to a non-http(s) location refused")  # the location is the server's text
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_url(url: str, limits: MediaLimits, limit_name: str, what: str) -> bytes:
    if not limits.allow_url_fetch:
        raise MediaError(f"fetching {what} from URLs is disabled (allow_url_fetch=False): {url[:200]}")
    cap_name = limit_name if getattr(limits, limit_name) <= limits.url_max_bytes else "url_max_bytes"
    deadline = time.monotonic() + limits.url_timeout_s
    opener = guarded_opener(frozenset(h.lower() for h in limits.allowed_media_domains), _HttpOnlyRedirects())
    request = urllib.request.Request(url, headers={"User-Agent": "vlserve-preprocess"})
    try:
        with opener.open(request, timeout=limits.url_timeout_s) as response:
            declared = response.headers.get("Content-Length")
            if declared and declared.isdigit():
                check_over(f"{what} at {url[:200]}", int(declared), "bytes", limits, cap_name)
            chunks, size = [], 0
            while chunk := response.read(_URL_CHUNK):
                chunks.append(chunk)
                size += len(chunk)
                check_over(f"{what} at {url[:200]}", size, "bytes (so far)", limits, cap_name)
                if time.monotonic() > deadline:
                    raise MediaError(f"fetching {url[:200]} took over the limit url_timeout_s={limits.url_timeout_s}")
    except urllib.error.HTTPError as e:  # the status code only: the reason phrase is the server's text
        raise MediaError(f"fetching {url[:200]} failed: HTTP {e.code}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, MediaError):
            raise e.reason from None
        raise MediaError(f"fetching {url[:200]} failed: {e.reason}") from None
    except (TimeoutError, OSError, ValueError) as e:
        if isinstance(e, MediaError):
            raise
        raise MediaError(f"fetching {url[:200]} failed: {e}") from None
    return b"".join(chunks)
