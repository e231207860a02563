"""OpenAI request bodies (validated by pydantic; they also make the OpenAPI schema) and response shapes.

Every field OpenAI documents for these routes is either honoured or refused with a 400 naming it
(UNSUPPORTED, checked in server/sampling.py); a field nobody documents is refused too (extra="forbid"),
so a client never believes an option took effect when it did not. docs/server.md lists each field.
"""

import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from vlserve.core.sampling_params import FLOAT32_MAX, FLOAT32_TINY, INT32_END

MAX_N = 16  # choices per request; each is a request in the engine


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class MediaURL(BaseModel):
    url: str = Field(min_length=1, description="data:<mime>;base64,<data>; http(s) only with --allow-url-fetch")
    detail: str | None = None


MEDIA_UUID = Field(default=None, min_length=1, max_length=256,
                   description="vLLM's media id: a later part with this uuid and no data reuses this media")


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: MediaURL | None = Field(default=None, description="may be left out where uuid names an image sent "
                                                                 "before")
    uuid: str | None = MEDIA_UUID


class VideoPart(BaseModel):
    type: Literal["video_url"]
    video_url: MediaURL | None = Field(default=None, description="may be left out where uuid names a video sent "
                                                                 "before")
    uuid: str | None = MEDIA_UUID


ContentPart = Annotated[TextPart | ImagePart | VideoPart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    """Any role; a request's messages are the role-specific kinds below (the schema says which need content)."""
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class SystemMessage(ChatMessage):
    role: Literal["system", "developer"]
    content: str | list[TextPart]


class UserMessage(ChatMessage):
    role: Literal["user"]
    content: str | list[ContentPart]


class AssistantMessage(ChatMessage):
    """content may be left out (the turn is then empty): tool calls are not supported (UNSUPPORTED)."""
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None


AnyChatMessage = Annotated[SystemMessage | UserMessage | AssistantMessage, Field(discriminator="role")]


class StreamOptions(BaseModel):
    include_usage: bool = False


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


# Documented OpenAI fields vlserve does not implement yet, with the value that means "off": a request
# that sends anything else gets a 400 naming the field.
UNSUPPORTED = {"suffix": (None,),
               "tools": (None, []), "tool_choice": (None, "none"), "parallel_tool_calls": (None,),
               "functions": (None, []), "function_call": (None, "none"), "modalities": (None, ["text"]),
               "audio": (None,), "prediction": (None,), "reasoning_effort": (None,), "web_search_options": (None,)}


class VideoIOKwargs(BaseModel):
    """How a request's videos are sampled (vLLM's media_io_kwargs.video; preprocess/media_options.py)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    num_frames: int | None = Field(default=None, ge=1, lt=INT32_END, description="frames spread evenly over the clip")
    fps: float | None = Field(default=None, gt=0, le=FLOAT32_MAX,
                              description="one frame every 1/fps seconds from t=0 (not with num_frames)")
    max_frames: int | None = Field(default=None, ge=1, lt=INT32_END,
                                   description="at most this many frames (a long clip sampled by fps is thinned)")


class MediaIOKwargs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    video: VideoIOKwargs | None = None


ProcessorKwargs = dict[str, Annotated[int | float | str | bool, Field(allow_inf_nan=False)]]


class MediaFields(BaseModel):
    """vLLM's per-request media options, on every generating route; server flags are the defaults."""
    media_io_kwargs: MediaIOKwargs | None = None
    mm_processor_kwargs: ProcessorKwargs | None = Field(
        default=None, description="keyword arguments for the model's processor; a key it does not take is a 400")

    def media_options(self) -> dict:
        """The engine's keyword arguments for these options (unset ones left out)."""
        io = self.media_io_kwargs.model_dump(exclude_none=True) if self.media_io_kwargs else None
        return {k: v for k, v in (("media_io_kwargs", io), ("mm_processor_kwargs", self.mm_processor_kwargs))
                if v is not None}


class SamplingFields(BaseModel):
    """The sampling options the chat and completion routes share, each bounded to what the engine
    computes with (SamplingParams.validate checks the same again for every route)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, lt=INT32_END)
    temperature: float | None = Field(default=None, ge=0, le=FLOAT32_MAX)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-2**63, lt=2**64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None  # for the caller's own tracking; nothing to do with it here
    store: bool | None = None  # nothing is stored either way
    metadata: dict | None = None
    service_tier: str | None = None
    # the extra sampling fields vLLM and SGLang accept
    top_k: int | None = Field(default=None, ge=-1, lt=INT32_END)
    min_p: float | None = Field(default=None, ge=0, le=1)
    ignore_eos: bool | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, lt=INT32_END)]] | None = None
    regex: str | None = None
    json_schema: str | dict | None = None
    skip_special_tokens: bool | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, ge=FLOAT32_TINY, le=2)
    min_tokens: int | None = Field(default=None, ge=0, lt=INT32_END)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    # documented but refused unless "off" (UNSUPPORTED)
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    functions: list | None = None
    function_call: str | dict | None = None
    modalities: list | None = None
    audio: dict | None = None
    prediction: dict | None = None
    reasoning_effort: str | None = None
    web_search_options: dict | None = None


class ChatCompletionRequest(SamplingFields, MediaFields):
    messages: list[AnyChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, lt=INT32_END)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True  # vLLM's and SGLang's chat extras
    continue_final_message: bool = False


class CompletionRequest(SamplingFields, MediaFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)  # alternatives per token (0 = the chosen only)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def usage_of(results: list[dict], prompts: int = 1) -> dict:
    """Usage of n choices per prompt: each prompt counts once (its first choice), completions all count."""
    n = len(results) // prompts
    firsts = [results[i * n]["meta_info"] for i in range(prompts)]
    return usage(sum(m["prompt_tokens"] for m in firsts),
                 sum(r["meta_info"]["completion_tokens"] for r in results),
                 sum(m["cached_tokens"] for m in firsts))


def envelope(object_type: str, rid: str, model: str, choices: list[dict], **extra) -> dict:
    return {"id": rid, "object": object_type, "created": int(time.time()), "model": model,
            "choices": choices, **extra}


def finish_reason(meta: dict) -> str | None:
    """stop, length, or abort (as vLLM reports an aborted request); an error never gets here as a
    finish reason: it is an error response or an error event."""
    return meta.get("finish_reason")
