"""The in-process backend: programs run on a vlserve Engine in this process (no HTTP)."""

import asyncio

from vlserve.lang.backend.native import NativeBackend
from vlserve.lang.chat_template import VICUNA


class EngineBackend(NativeBackend):
    def __init__(self, engine, chat_template=VICUNA):
        self.engine = engine
        self.chat_template = chat_template

    def media_value(self, item):
        return item.data

    def call(self, payload: dict):
        kwargs = _engine_kwargs(payload)
        result = self.engine.generate(**kwargs)
        for r in result if isinstance(result, list) else [result]:
            if r.get("error"):
                raise RuntimeError(f"vlserve engine: {r['error']}")
        return result

    def call_stream(self, payload: dict):
        # The engine's streaming API is async; this worker thread runs its own loop to read it.
        loop = asyncio.new_event_loop()
        chunks = None
        try:
            chunks = loop.run_until_complete(self.engine.async_generate(stream=True, **_engine_kwargs(payload)))
            while True:
                try:
                    chunk = loop.run_until_complete(chunks.__anext__())
                except StopAsyncIteration:
                    return
                if chunk.get("error"):
                    raise RuntimeError(f"vlserve engine: {chunk['error']}")
                yield chunk
        finally:
            if chunks is not None:
                loop.run_until_complete(chunks.aclose())
            loop.close()

    def shutdown(self) -> None:
        self.engine.shutdown()


def _engine_kwargs(payload: dict) -> dict:
    kwargs = dict(payload)
    if "text" in kwargs:
        kwargs["prompt"] = kwargs.pop("text")
    return kwargs
