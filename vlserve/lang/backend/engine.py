"""The in-process backend: programs run on a vlserve Engine in this process (no HTTP)."""

import asyncio
import dataclasses

import vlserve
from vlserve.engine.sglang_logprobs import sglang_logprobs
from vlserve.lang.backend.native import NativeBackend
from vlserve.lang.chat_template import VICUNA


class EngineBackend(NativeBackend):
    def __init__(self, engine, chat_template=VICUNA):
        self.engine = engine
        self.chat_template = chat_template

    def media_value(self, item):
        return item.data

    def call(self, payload: dict):
        texts = payload.get("return_text_in_logprobs")
        result = self.engine.generate(**_engine_kwargs(payload))
        for r in result if isinstance(result, list) else [result]:
            if r.get("error"):
                raise RuntimeError(f"vlserve engine: {r['error']}")
            sglang_logprobs(r["meta_info"], self.engine.tokenizer if texts else None)  # as the server's answers
        return result

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict:
        return {**dataclasses.asdict(self.engine.args), "version": vlserve.__version__}

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
    kwargs.pop("return_text_in_logprobs", None)
    if "text" in kwargs:
        kwargs["prompt"] = kwargs.pop("text")
    return kwargs
