"""SGLang's native service routes: /flush_cache, /get_model_info and /model_info, /get_server_info and
/server_info (SGLang's newer names, the same answers), /tokenize, /detokenize.

model_path is the checkpoint directory, as SGLang reports the path it serves; SGLang's frontend picks
its chat template from it (`get_chat_template_by_model_path`). The built-in model's path would pick
SGLang's plain "default" template, so for it model_path names the format the model was trained on,
"USER: <image>\n… ASSISTANT: …</s>" (LLaVA-1.5's, SGLang's "vicuna_v1.1"); tokenizer_path is always the
directory (where the tokenizer, chat template and processor config are: what the router reads).

/tokenize and /detokenize accept images and videos too: the ids they show are the ones the radix tree
sees (each image or frame as its pseudo-token keys); /detokenize renders a run of pseudo tokens as
`<image>`.
"""

import dataclasses
import os

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

import vlserve
from vlserve.model.builtin import BUILTIN_MODEL_DIR
from vlserve.preprocess import is_pseudo_token
from vlserve.server.args import ServerArgs
from vlserve.server.errors import APIError, ErrorMappingRoute


BUILTIN_MODEL_PATH = "vlserve-builtin-llava-v1.5"


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | list[str]
    add_special_tokens: bool = True
    image_data: str | list[str] | None = Field(default=None, description="data URI or base64, as /generate")
    video_data: str | list[str] | None = None


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]
    skip_special_tokens: bool = True


def admin_router(engine, args: ServerArgs) -> APIRouter:
    router = APIRouter(route_class=ErrorMappingRoute)

    @router.api_route("/flush_cache", methods=["GET", "POST"], response_class=PlainTextResponse)
    async def flush_cache() -> Response:
        if not engine.flush_cache():
            raise APIError(400, "requests are waiting or running: the cache is flushed only while the server "
                                "is idle", code="server_busy")
        return Response("Cache flushed.\n", media_type="text/plain")

    @router.get("/get_model_info")
    @router.get("/model_info")
    async def get_model_info() -> dict:
        hf = engine.loaded.hf_config
        return {"model_path": _model_path(engine.loaded.path), "tokenizer_path": engine.loaded.path,
                "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": True, "has_audio_understanding": False, "model_type": hf.model_type,
                "architectures": list(hf.architectures or []), "served_model_name": args.model_name()}

    @router.get("/get_server_info")
    @router.get("/server_info")
    async def get_server_info() -> dict:
        info = {k: v for k, v in dataclasses.asdict(args).items() if k != "api_key"}
        state = {"kv_pool_tokens": engine.pool_state(), "kv_pool_capacity_tokens": engine.memory.allocator.capacity,
                 "num_waiting_requests": len(engine.scheduler.waiting),
                 "num_running_requests": len(engine.scheduler.running), "context_length": engine.context_len,
                 "memory_usage": engine.memory_budget.memory_usage()}  # SGLang's keys, and the bytes
        return {**info, "version": vlserve.__version__, "internal_states": [state]}

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if not isinstance(body.prompt, str) and (body.image_data or body.video_data):
            raise APIError(400, "images and videos go with a single prompt", param="image_data")
        tokens = [_tokenize(engine, p, body) for p in prompts]
        result = tokens[0] if isinstance(body.prompt, str) else tokens
        count = len(result) if isinstance(body.prompt, str) else [len(t) for t in tokens]
        return {"tokens": result, "count": count, "max_model_len": engine.context_len}

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        vocab = engine.loaded.config.text.vocab_size
        bad = [t for t in body.tokens if t < 0 or (t >= vocab and not is_pseudo_token(t))]
        if bad:
            raise APIError(400, f"tokens {bad[:8]} are neither vocabulary ids [0, {vocab}) nor image keys",
                           param="tokens")
        return {"text": _detokenize(engine, body.tokens, body.skip_special_tokens)}

    return router


def _model_path(path: str) -> str:
    return BUILTIN_MODEL_PATH if os.path.realpath(path) == os.path.realpath(BUILTIN_MODEL_DIR) else path


def _tokenize(engine, prompt: str, body: TokenizeRequest) -> list[int]:
    ids = engine.tokenize(prompt=prompt, image_data=body.image_data, video_data=body.video_data)
    bos = engine.tokenizer.bos_token_id
    if (not body.add_special_tokens and ids and ids[0] == bos
            and not prompt.startswith(engine.tokenizer.bos_token or "\0")):
        ids = ids[1:]
    return ids


def _detokenize(engine, tokens: list[int], skip_special_tokens: bool) -> str:
    """Text for vocabulary ids; `<image>` for each image's run of pseudo tokens (one per run where the
    count depends on the image: adjacent images cannot be told apart from their keys alone)."""
    vocab, per_image = engine.loaded.config.text.vocab_size, engine.loaded.config.fixed_image_tokens
    parts, i = [], 0
    while i < len(tokens):
        media = tokens[i] >= vocab
        j = i
        while j < len(tokens) and (tokens[j] >= vocab) == media:
            j += 1
        if media:
            parts.append("<image>" * (max(1, round((j - i) / per_image)) if per_image else 1))
        else:
            parts.append(engine.tokenizer.decode(tokens[i:j], skip_special_tokens=skip_special_tokens))
        i = j
    return "".join(parts)
