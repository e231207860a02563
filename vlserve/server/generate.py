"""The native route, as SGLang's: POST /generate.

{"text" | "input_ids", "image_data", "video_data", "sampling_params", "stream", "return_logprob",
 "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "media_io_kwargs",
 "mm_processor_kwargs", "video_num_frames" | "video_fps"}
→ {"text", "output_ids", "meta_info"}. A list of prompts (text: [...] or input_ids: [[...], ...]) is a
batch: image_data[i] / video_data[i], sampling_params[i] (or one dict for all) and the logprob fields
(or one value for all) belong to prompt i, one image_data string belongs to every prompt (SGLang's
`select` sends its choices so), and the answer is a list. Streaming (single prompts only) sends
cumulative chunks `data: {"text", "output_ids", "meta_info"}` (every stream_interval tokens) and then
`data: [DONE]`. Logprobs are SGLang's (engine/sglang_logprobs.py).
"""

from fastapi import APIRouter, Request
from pydantic import Field

from vlserve.server.disconnect import cancel_on_disconnect
from vlserve.server.errors import APIError, ErrorMappingRoute, error_event, raise_if_failed
from vlserve.server.fanout import MergedStream, generate_all, open_streams
from vlserve.server.openai_protocol import MediaFields
from vlserve.engine.sglang_logprobs import sglang_logprobs
from vlserve.server.sse import DONE, SSEResponse, event

MAX_BATCH = 64

MediaList = str | list[str | list[str] | None] | None


class GenerateRequest(MediaFields):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    image_data: MediaList = Field(default=None, description="data URI or base64 (a URL with --allow-url-fetch)")
    video_data: MediaList = None
    sampling_params: dict | list[dict] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] | None = False
    # unset: output logprobs only (SGLang's -1), except for a prefill-only request (max_new_tokens 0),
    # which has no output: there every prompt position's (SGLang's frontend scores select's choices so)
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = 0
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None
    video_num_frames: int | None = None  # aliases of media_io_kwargs.video's num_frames and fps
    video_fps: float | None = None
    # SGLang's request fields vlserve has no use for: accepted unset, refused otherwise (by name)
    lora_path: str | list[str | None] | None = None
    session_id: str | None = None
    custom_logit_processor: str | list[str | None] | None = None
    return_hidden_states: bool = False
    token_ids_logprob: list | None = None


UNSUPPORTED_FIELDS = {"lora_path": "LoRA adapters", "session_id": "sessions",
                      "custom_logit_processor": "custom logit processors",
                      "return_hidden_states": "hidden states", "token_ids_logprob": "logprobs of chosen token ids"}


def generate_router(engine) -> APIRouter:
    router = APIRouter(route_class=ErrorMappingRoute)

    @router.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        _refuse_unsupported(body)
        jobs, batch = _jobs(body, engine.loaded.config.image_token_id)
        shape = _shaper(engine, body)
        if body.stream:
            if batch:
                raise APIError(400, "stream is not supported for a batch of prompts; send them one by one",
                               param="stream")
            interval = jobs[0].pop("stream_interval")
            return SSEResponse(native_events(await open_streams(engine, jobs), shape, interval))
        for job in jobs:
            job.pop("stream_interval")
        results = await cancel_on_disconnect(request, generate_all(engine, jobs))
        for r in results:
            raise_if_failed(r)
        answers = [shape(r) for r in results]
        return answers if batch else answers[0]

    return router


def _refuse_unsupported(body: GenerateRequest) -> None:
    for name, what in UNSUPPORTED_FIELDS.items():
        value = getattr(body, name)
        values = value if isinstance(value, list) else [value]  # a batch may give one per prompt
        if any(v is not None and v is not False for v in values):
            raise APIError(400, f"{name} is not supported: vlserve has no {what} (send it unset)", param=name,
                           code="unsupported_parameter")


def _shaper(engine, body: GenerateRequest):
    """The function that turns an engine result into this request's answer."""
    tokenizer = engine.tokenizer if body.return_text_in_logprobs else None
    return lambda chunk: native_result(chunk, tokenizer)


def native_result(chunk: dict, tokenizer=None) -> dict:
    """SGLang's /generate answer: meta_info.finish_reason is an object, {"type": "stop", "matched":
    token id | stop string | null}, {"type": "length", "length": N} or {"type": "abort", "message"};
    logprob entries are [logprob, id, text] (text with return_text_in_logprobs: a tokenizer, else null)."""
    meta = sglang_logprobs(dict(chunk["meta_info"]), tokenizer)
    meta["finish_reason"] = _finish_object(meta.pop("finish_reason", None), meta.pop("matched_stop", None),
                                           meta.get("completion_tokens", 0), chunk.get("error"))
    return {"text": chunk["text"], "output_ids": chunk["output_ids"], "meta_info": meta}


def _finish_object(reason: str | None, matched, completion_tokens: int, error: str | None) -> dict | None:
    if reason == "stop":
        return {"type": "stop", "matched": matched}
    if reason == "length":
        return {"type": "length", "length": completion_tokens}
    if reason in ("abort", "error"):
        return {"type": "abort", "message": error or "the request was aborted"}
    return None


async def native_events(merged: MergedStream, shape=native_result, interval: int = 1):
    """A chunk every `interval` output tokens, and the last one."""
    sent = 0
    try:
        async for _, chunk in merged:
            if chunk.get("error"):
                yield event(error_event(chunk))
                break
            done = chunk.get("finished") or len(chunk["output_ids"]) - sent >= interval
            if done:
                sent = len(chunk["output_ids"])
                yield event(shape(chunk))
        yield DONE
    finally:
        await merged.aclose()


def _jobs(body: GenerateRequest, image_token_id: int) -> tuple[list[dict], bool]:
    """One make_request kwargs dict per prompt, and whether the request was a batch. One image_data
    string for a batch of input_ids goes to the prompts that hold the image token (SGLang's frontend
    sends select's unconditional scoring, the choices' ids alone, with the program's image)."""
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "give exactly one of text or input_ids", param="text")
    prompts = body.text if body.text is not None else body.input_ids
    batch = isinstance(prompts, list) and bool(prompts) and not isinstance(prompts[0], int)
    if not batch:
        prompts = [prompts]
    if len(prompts) > MAX_BATCH:
        raise APIError(400, f"a batch of {len(prompts)} prompts is over the limit of {MAX_BATCH}", param="text")
    key = "prompt" if body.text is not None else "input_ids"
    jobs = []
    for i, prompt in enumerate(prompts):
        params = _pick_params(body.sampling_params, i, batch)
        rid = body.rid[i] if isinstance(body.rid, list) and i < len(body.rid) else body.rid if not batch else None
        image = _pick_media(body.image_data, i, batch, "image_data")
        if batch and isinstance(body.image_data, str) and key == "input_ids" and image_token_id not in prompt:
            image = None
        jobs.append({key: prompt, "rid": rid, "image_data": image,
                     "video_data": _pick_media(body.video_data, i, batch, "video_data"),
                     "stream_interval": _stream_interval(params), "sampling_params": params,
                     "fit_max_new_tokens": "max_new_tokens" not in params, **_request_extras(body, i, batch, params)})
    return jobs, batch


def _request_extras(body: GenerateRequest, i: int, batch: bool, params: dict) -> dict:
    extras = {"return_logprob": _pick(body.return_logprob, i, batch, "return_logprob"),
              "logprob_start_len": _pick(body.logprob_start_len, i, batch, "logprob_start_len"),
              "top_logprobs_num": _pick(body.top_logprobs_num, i, batch, "top_logprobs_num"),
              "video_num_frames": body.video_num_frames, "video_fps": body.video_fps, **body.media_options()}
    if extras["logprob_start_len"] is None and extras["return_logprob"] and params.get("max_new_tokens") == 0:
        extras["logprob_start_len"] = 0
    return {k: v for k, v in extras.items() if v is not None}


def _pick(value, i: int, batch: bool, name: str):
    """A request-level field: one value for every prompt, or (in a batch) a list with one per prompt."""
    if not isinstance(value, list):
        return value
    if not batch or len(value) <= i:
        raise APIError(400, f"{name} must be one value, or a list with one value per prompt of a batch", param=name)
    return value[i]


def _stream_interval(params: dict) -> int:
    interval = params.pop("stream_interval", None)
    if interval is None:
        return 1
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise APIError(400, f"stream_interval must be an integer >= 1, got {interval!r}",
                       param="sampling_params.stream_interval")
    return interval


def _pick_media(media: MediaList, i: int, batch: bool, name: str):
    """Prompt i's media: for a single prompt, a string or a list of strings; for a batch, media[i], or
    the one string given for every prompt (as SGLang's server does)."""
    if not batch:
        if isinstance(media, list) and not all(isinstance(m, str) for m in media):
            raise APIError(400, f"{name} of a single prompt must be a string or a list of strings", param=name)
        return media
    if media is None or isinstance(media, str):
        return media
    if len(media) <= i:
        raise APIError(400, f"{name} of a batch must be one string for every prompt, or a list with one entry "
                            "per prompt", param=name)
    return media[i]


def _pick_params(params: dict | list[dict] | None, i: int, batch: bool) -> dict:
    if isinstance(params, list):
        if not batch or len(params) <= i:
            raise APIError(400, "sampling_params must be one dict, or a list with one dict per prompt of a batch",
                           param="sampling_params")
        params = params[i]
    return dict(params or {})
