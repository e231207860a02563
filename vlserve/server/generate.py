"""The native route, as SGLang's: POST /generate.

{"text" | "input_ids", "image_data", "video_data", "sampling_params", "stream", "return_logprob",
 "logprob_start_len", "video_num_frames" | "video_fps"} → {"text", "output_ids", "meta_info"}.
A list of prompts (text: [...] or input_ids: [[...], ...]) is a batch: image_data[i] / video_data[i]
and sampling_params[i] (or one dict for all) belong to prompt i, and the answer is a list.
Streaming (single prompts only) sends cumulative chunks `data: {"text", "output_ids", "meta_info"}`
and then `data: [DONE]`.
"""

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from vlserve.server.disconnect import cancel_on_disconnect
from vlserve.server.errors import APIError, ErrorMappingRoute, error_event, raise_if_failed
from vlserve.server.fanout import MergedStream, generate_all, open_streams
from vlserve.server.sse import DONE, SSEResponse, event

MAX_BATCH = 64

MediaList = str | list[str | list[str] | None] | None


class GenerateRequest(BaseModel):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    image_data: MediaList = Field(default=None, description="data URI or base64 (a URL with --allow-url-fetch)")
    video_data: MediaList = None
    sampling_params: dict | list[dict] | None = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    rid: str | list[str] | None = None
    video_num_frames: int | None = None
    video_fps: float | None = None


def generate_router(engine) -> APIRouter:
    router = APIRouter(route_class=ErrorMappingRoute)

    @router.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        jobs, batch = _jobs(body)
        if body.stream:
            if batch:
                raise APIError(400, "stream is not supported for a batch of prompts; send them one by one",
                               param="stream")
            return SSEResponse(native_events(await open_streams(engine, jobs)))
        results = await cancel_on_disconnect(request, generate_all(engine, jobs))
        for r in results:
            raise_if_failed(r)
        answers = [native_result(r) for r in results]
        return answers if batch else answers[0]

    return router


def native_result(chunk: dict) -> dict:
    """SGLang's /generate answer: meta_info.finish_reason is an object, {"type": "stop", "matched":
    token id | stop string | null}, {"type": "length", "length": N} or {"type": "abort", "message"}."""
    meta = dict(chunk["meta_info"])
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


async def native_events(merged: MergedStream):
    try:
        async for _, chunk in merged:
            if chunk.get("error"):
                yield event(error_event(chunk))
                break
            yield event(native_result(chunk))
        yield DONE
    finally:
        await merged.aclose()


def _jobs(body: GenerateRequest) -> tuple[list[dict], bool]:
    """One make_request kwargs dict per prompt, and whether the request was a batch."""
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
        jobs.append({key: prompt, "rid": rid, "image_data": _pick_media(body.image_data, i, batch, "image_data"),
                     "video_data": _pick_media(body.video_data, i, batch, "video_data"),
                     "sampling_params": params, "fit_max_new_tokens": "max_new_tokens" not in params,
                     **_request_extras(body)})
    return jobs, batch


def _request_extras(body: GenerateRequest) -> dict:
    extras = {"return_logprob": body.return_logprob, "logprob_start_len": body.logprob_start_len,
              "top_logprobs_num": body.top_logprobs_num, "video_num_frames": body.video_num_frames,
              "video_fps": body.video_fps}
    return {k: v for k, v in extras.items() if v is not None}


def _pick_media(media: MediaList, i: int, batch: bool, name: str):
    """Prompt i's media: for a single prompt, a string or a list of strings; for a batch, media[i]."""
    if not batch:
        if isinstance(media, list) and not all(isinstance(m, str) for m in media):
            raise APIError(400, f"{name} of a single prompt must be a string or a list of strings", param=name)
        return media
    if media is None:
        return None
    if isinstance(media, str) or len(media) <= i:
        raise APIError(400, f"{name} of a batch must be a list with one entry per prompt", param=name)
    return media[i]


def _pick_params(params: dict | list[dict] | None, i: int, batch: bool) -> dict:
    if isinstance(params, list):
        if not batch or len(params) <= i:
            raise APIError(400, "sampling_params must be one dict, or a list with one dict per prompt of a batch",
                           param="sampling_params")
        params = params[i]
    return dict(params or {})
