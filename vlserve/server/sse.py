"""Server-sent events: `data: <json>\n\n` lines ending with `data: [DONE]`."""

import json

import anyio
from starlette.responses import StreamingResponse

DONE = "data: [DONE]\n\n"

# Line ends to str.splitlines (and so to httpx's iter_lines) that JSON leaves raw in strings: a client
# splitting on them would cut an event in two. Escaped, they decode to the same text.
_RAW_LINE_ENDS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False).translate(_RAW_LINE_ENDS)}\n\n"


class SSEResponse(StreamingResponse):
    """A streaming response that always closes its body iterator, so a client that disconnects while
    the iterator is suspended (not only while it awaits) still runs its cleanup: the engine abort."""

    media_type = "text/event-stream"

    def __init__(self, content, **kwargs):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}, **kwargs)

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
