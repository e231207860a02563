"""POST /upload: multipart/form-data for curl and browsers; answers as /generate does.

    curl -F image=@cat.jpg -F prompt='What is this?' http://127.0.0.1:30000/upload

Fields: prompt (required); image (repeatable) or one video; chat (default true: wrap the prompt in the
model's chat template; false sends it raw); stream; sampling fields max_new_tokens, temperature,
top_p, top_k, seed, stop (repeatable), regex, json_schema; video sampling num_frames or fps, and
max_frames (aliases of media_io_kwargs.video's, preprocess/media_options.py).
"""

from fastapi import APIRouter, File, Form, Request, UploadFile

from vlserve.core.sampling_params import FLOAT32_MAX, INT32_END
from vlserve.server.chat import media_prompt
from vlserve.server.disconnect import cancel_on_disconnect
from vlserve.server.errors import APIError, ErrorMappingRoute, raise_if_failed
from vlserve.server.fanout import generate_all, open_streams
from vlserve.server.generate import native_events, native_result
from vlserve.server.sse import SSEResponse


def upload_router(engine) -> APIRouter:
    router = APIRouter(route_class=ErrorMappingRoute)

    @router.post("/upload")
    async def upload(
        request: Request,
        prompt: str = Form(...),
        image: list[UploadFile] = File(default=[]),
        video: list[UploadFile] = File(default=[]),
        chat: bool = Form(True),
        stream: bool = Form(False),
        # Optional fields are typed without None: multipart has no null, so the schema offers none
        # (a client's JSON null would arrive as the text "null"); absent or empty means unset.
        max_new_tokens: int = Form(None, ge=0, lt=INT32_END),
        temperature: float = Form(None, ge=0, le=FLOAT32_MAX, allow_inf_nan=False),
        top_p: float = Form(None, gt=0, le=1, allow_inf_nan=False),
        top_k: int = Form(None, ge=-1, lt=INT32_END),
        seed: int = Form(None, ge=-2**63, lt=2**64),
        stop: list[str] = Form(default=[]),
        regex: str = Form(None),
        json_schema: str = Form(None),
        num_frames: int = Form(None, ge=1, lt=INT32_END),
        fps: float = Form(None, gt=0, le=FLOAT32_MAX, allow_inf_nan=False),
        max_frames: int = Form(None, ge=1, lt=INT32_END),
    ):
        if len(video) > 1:
            raise APIError(400, f"send at most one video file, got {len(video)}", param="video")
        if video and image:
            raise APIError(400, "send images or one video, not both", param="video")
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                  "seed": seed, "stop": stop or None, "regex": regex, "json_schema": json_schema}
        params = {k: v for k, v in params.items() if v is not None}
        text = media_prompt(engine.tokenizer, prompt, len(image), len(video)) if chat else prompt
        job = {"prompt": text, "image_data": [await f.read() for f in image] or None,
               "video_data": [await f.read() for f in video] or None, "sampling_params": params,
               "fit_max_new_tokens": max_new_tokens is None, "video_num_frames": num_frames, "video_fps": fps,
               "media_io_kwargs": {"video": {"max_frames": max_frames}} if max_frames else None}
        if stream:
            return SSEResponse(native_events(await open_streams(engine, [job])))
        [result] = await cancel_on_disconnect(request, generate_all(engine, [job]))
        raise_if_failed(result)
        return native_result(result)

    return router
