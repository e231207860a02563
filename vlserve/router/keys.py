"""The routing key of a request: the token ids the worker's radix tree will see.

Computed by the engine's own code from the same bytes: the chat template (server/chat.py), the
tokenizer, and RequestBuilder.token_ids, which decodes and hashes each image and writes its
pseudo-token pad values (preprocess/). Two requests that share a picture share a key prefix; the same
text with another picture does not (docs/ARCHITECTURE.md, invariant 4).

A request the router cannot key (bad JSON, a URL the router may not fetch, an invalid prompt) gets
no key: it is routed by load alone, and the worker answers it with the error it would give anyway.
"""

import json
import logging

from vlserve.engine.request_builder import RequestBuilder
from vlserve.preprocess import DEFAULT_NUM_FRAMES, MediaLimits, ProcessedImageCache
from vlserve.router.media_refs import with_media_data
from vlserve.router.model_files import ModelFiles
from vlserve.server.chat import build_chat_prompt
from vlserve.server.openai_protocol import ChatCompletionRequest

log = logging.getLogger(__name__)

KEYED_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")


class RouteKeys:
    def __init__(self, files: ModelFiles, limits: MediaLimits = MediaLimits(), video_frames: int = DEFAULT_NUM_FRAMES):
        self.tokenizer = files.tokenizer
        # token_ids() reads only the tokenizer, config, processing, limits, frames and image cache:
        # the length limits and the constraint compiler belong to build(), which the router never calls.
        self.builder = RequestBuilder(files.tokenizer, files.config, files.image_processing,
                                      limits, video_frames, context_len=0, pool_capacity=0, compiler=None,
                                      image_cache=ProcessedImageCache())

    def route(self, path: str, body: bytes, scope: str = "") -> tuple[list[int] | None, bytes]:
        """The request's radix key and the body to send: a chat request's uuid-only media parts given
        their data (media_refs.py; InvalidRequest naming a uuid unknown in the API key's scope)."""
        if path == "/v1/chat/completions":
            body = with_media_data(body, scope, self.builder.media_ids)
        return self.key(path, body, scope), body

    def key(self, path: str, body: bytes, scope: str = "") -> list[int] | None:
        """The radix key of a request to `path` with this JSON body (a batch: its first prompt); a
        chat part's uuid is remembered, and looked up, in `scope` (the API key's, engine/media_ids.py)."""
        if path not in KEYED_PATHS:
            return None
        try:
            data = json.loads(body)
            inputs = self._inputs(path, data) if isinstance(data, dict) else None
            return self.builder.token_ids(**inputs, media_scope=scope) if inputs else None
        except Exception as e:  # whatever the request's fault, the worker reports it; routing must not fail
            log.debug("no routing key for a request to %s: %s: %s", path, type(e).__name__, e)
            return None

    def _inputs(self, path: str, data: dict) -> dict | None:
        if path == "/v1/chat/completions":
            chat = ChatCompletionRequest.model_validate(data)
            prompt = build_chat_prompt(self.tokenizer, chat.messages, chat.add_generation_prompt,
                                       chat.continue_final_message)
            return {"prompt": prompt.text, "image_data": prompt.images or None, "video_data": prompt.videos or None,
                    **chat.media_options()}
        if path == "/v1/completions":
            return _first_prompt(data.get("prompt"))
        inputs = _first_prompt(data.get("text") or data.get("input_ids"))
        if inputs is None:
            return None
        prompts = data.get("text") or data.get("input_ids")
        batch = isinstance(prompts, list) and isinstance(prompts[0], (str, list))
        for media in ("image_data", "video_data"):
            value = data.get(media)
            inputs[media] = value[0] if batch and isinstance(value, list) and value else value
        for extra in ("video_num_frames", "video_fps", "media_io_kwargs", "mm_processor_kwargs"):
            inputs[extra] = data.get(extra)
        return inputs


def _first_prompt(prompt) -> dict | None:
    """The first prompt of a single prompt or a batch, as {"prompt": text} or {"input_ids": ids}."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, list) and prompt:
        head = prompt[0]
        if isinstance(head, int):
            return {"input_ids": prompt}
        if isinstance(head, str):
            return {"prompt": head}
        if isinstance(head, list):
            return {"input_ids": head}
    return None
