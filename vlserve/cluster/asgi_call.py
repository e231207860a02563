"""One HTTP request through an ASGI app in this process, its answer streamed back as it is produced:
first {"status", "headers"}, then the body's chunks. A replica runs vlserve's own FastAPI app this way,
so a Ray replica answers exactly as `vlserve serve` does, streams included."""

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator


@dataclass(frozen=True)
class HTTPCall:
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes


async def call_asgi(app, call: HTTPCall) -> AsyncIterator[dict | bytes]:
    messages: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()  # set when the caller stops reading: the app sees a disconnect
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": call.method,
             "scheme": "http", "path": call.path, "raw_path": call.path.encode(), "root_path": "",
             "query_string": call.query.encode(), "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80),
             "headers": [(k.lower().encode(), v.encode()) for k, v in call.headers]}
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": call.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    task = asyncio.create_task(app(scope, receive, messages.put))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                yield {"status": message["status"],
                       "headers": [(k.decode(), v.decode()) for k, v in message.get("headers", [])]}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body"):
                    break
        if task.done() and task.exception() is not None:
            raise task.exception()
    finally:
        gone.set()
