"""Media ids behind the router: a chat content part naming a `uuid` without data is given its data
by the router, from the bytes it saw sent with that uuid under the same API key.

The router keys every chat request with the engine's own RequestBuilder (keys.py), whose media-id
store remembers each part sent with data and a uuid, scoped by the key the request carried. A later
part with only the uuid then goes to a worker with its bytes, under the same uuid: whichever worker
the policy picks (the one whose tree holds the media's prefix, or another when loads are unbalanced,
or a retry elsewhere) answers it as if the client had sent the bytes again, with the same cached
prefix where that worker has it. An id the router does not know under the request's key is a 400
naming it, from the router: workers behind it (`--dp-size`, which start without the API key) never
see a bare uuid, so one key's ids never reach another's requests.
"""

import base64
import json

from vlserve.engine.media_ids import MediaIdStore

PART_KINDS = {"image_url": "image", "video_url": "video"}  # a content part's type → the store's kind


def with_media_data(body: bytes, scope: str, store: MediaIdStore) -> bytes:
    """The chat request's body with every uuid-only media part given its data (unchanged where there
    is none, or where the body is not a chat request the router can read: the worker reports that)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    parts = [part for part in _content_parts(data) if _needs_data(part)]
    for part in parts:
        raw = store.lookup(scope, PART_KINDS[part["type"]], part["uuid"])  # InvalidRequest naming an unknown id
        part[part["type"]] = {"url": "data:application/octet-stream;base64," + base64.b64encode(raw).decode()}
    return json.dumps(data).encode() if parts else body


def _content_parts(data) -> list[dict]:
    messages = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(messages, list):
        return []
    contents = [m.get("content") for m in messages if isinstance(m, dict)]
    return [part for content in contents if isinstance(content, list) for part in content if isinstance(part, dict)]


def _needs_data(part: dict) -> bool:
    return part.get("type") in PART_KINDS and isinstance(part.get("uuid"), str) and part.get(part["type"]) is None
