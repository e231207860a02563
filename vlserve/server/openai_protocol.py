"""OpenAI request bodies (validated by pydantic; they also make the OpenAPI schema) and response shapes.

Unknown fields are ignored, as OpenAI-compatible servers commonly do, so clients that send extra
options keep working; every field we read is validated and a bad one is a 400 naming it.
"""

import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 16  # choices per request; each is a request in the engine


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class MediaURL(BaseModel):
    url: str = Field(min_length=1, description="data:<mime>;base64,<data>; http(s) only with --allow-url-fetch")
    detail: str | None = None


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: MediaURL


class VideoPart(BaseModel):
    type: Literal["video_url"]
    video_url: MediaURL


ContentPart = Annotated[TextPart | ImagePart | VideoPart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


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


class SamplingFields(BaseModel):
    """The sampling options the chat and completion routes share."""
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]


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
    reason = meta.get("finish_reason")
    return reason if reason in (None, "stop", "length") else "stop"
