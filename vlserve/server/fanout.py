"""Several engine requests for one HTTP request (n choices, or a batch of prompts).

Either all of them are accepted or none stays in the engine: if one fails validation (or the queue
is full), the others are cancelled and aborted. Streams are merged in arrival order, and closing the
merged stream (the client went away) aborts every request that has not finished.
"""

import asyncio
import uuid
from typing import AsyncIterator


async def generate_all(engine, kwargs_list: list[dict]) -> list[dict]:
    """Final results, in order. Cancelling the caller aborts every request."""
    tasks = [asyncio.ensure_future(engine.async_generate(**kw)) for kw in kwargs_list]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()  # no-op for finished ones; the rest abort themselves (async_generate)


async def open_streams(engine, kwargs_list: list[dict]) -> "MergedStream":
    """Submits every request, then returns their chunks merged. Raises (aborting all) if any is refused."""
    rids = [kw.get("rid") or uuid.uuid4().hex for kw in kwargs_list]
    tasks = [asyncio.ensure_future(engine.async_generate(**{**kw, "stream": True, "rid": rid}))
             for rid, kw in zip(rids, kwargs_list)]
    try:
        streams = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        for rid in rids:
            engine.abort(rid)  # those already submitted; unknown ids are ignored
        raise
    return MergedStream(engine, rids, streams)


class MergedStream:
    """Async iterator of (index, chunk); aclose() aborts whatever is still running."""

    def __init__(self, engine, rids: list[str], streams: list[AsyncIterator[dict]]):
        self.engine, self.rids, self.streams = engine, rids, streams
        self._queue: asyncio.Queue = asyncio.Queue()
        self._pumps: list[asyncio.Task] = []
        self._open = len(streams)

    def __aiter__(self):
        if not self._pumps:
            self._pumps = [asyncio.ensure_future(self._pump(i, s)) for i, s in enumerate(self.streams)]
        return self

    async def __anext__(self) -> tuple[int, dict]:
        while self._open:
            index, chunk = await self._queue.get()
            if chunk is None:
                self._open -= 1
                continue
            return index, chunk
        raise StopAsyncIteration

    async def _pump(self, index: int, stream: AsyncIterator[dict]) -> None:
        try:
            async for chunk in stream:
                self._queue.put_nowait((index, chunk))
        finally:
            self._queue.put_nowait((index, None))

    async def aclose(self) -> None:
        for task in self._pumps:
            task.cancel()  # a pump's cancellation runs its engine stream's finally: abort if unfinished
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for stream in self.streams:
            await stream.aclose()
        for rid in self.rids:
            self.engine.abort(rid)  # streams never iterated have no finally to run
