"""Non-streaming requests: a client that disconnects before the answer cancels (aborts) its generation."""

import asyncio

from fastapi import Request

from vlserve.server.errors import APIError


async def cancel_on_disconnect(request: Request, work):
    """Awaits `work`; if the client disconnects first, cancels it and raises APIError(499)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise APIError(499, "client disconnected before the response")
    finally:
        watcher.cancel()
        task.cancel()


async def _disconnected(request: Request) -> None:
    # The body has been read by now, so the next ASGI message can only be http.disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
