"""OpenAI chat messages → the checkpoint's chat template → (prompt text, image sources, video sources).

Image parts become {"type": "image"} (the template renders `<image>`); a video part becomes the text
"<video>", which the engine expands into one `<image>` per sampled frame. Media sources are passed
through undecoded: the engine decodes them in its media pool, off the event loop and the engine loop.
A part with a `uuid` (vLLM's media id) becomes a MediaRef: with data, the engine remembers it under
the id; without, the engine reuses what that id was sent with (engine/media_ids.py).
"""

from dataclasses import dataclass, field

from vlserve.core.errors import InvalidRequest
from vlserve.engine.media_ids import MediaRef
from vlserve.server.openai_protocol import ChatMessage, ImagePart, MediaURL, TextPart, VideoPart

VIDEO_TEXT = "<video>"


@dataclass
class ChatPrompt:
    text: str
    images: list[str | MediaRef] = field(default_factory=list)
    videos: list[str | MediaRef] = field(default_factory=list)


def build_chat_prompt(tokenizer, messages: list[ChatMessage], add_generation_prompt: bool = True,
                      continue_final_message: bool = False) -> ChatPrompt:
    """continue_final_message (vLLM's and SGLang's field): the last, assistant message is left open
    so the answer continues it."""
    prompt, converted = ChatPrompt(""), []
    for i, message in enumerate(messages):
        role = "system" if message.role == "developer" else message.role
        converted.append({"role": role, "content": _content(message, i, prompt)})
    prompt.text = render_chat(tokenizer, converted, add_generation_prompt, continue_final_message)
    return prompt


def media_prompt(tokenizer, text: str, num_images: int, num_videos: int) -> str:
    """One user turn: its images, then its videos, then the text (as /upload sends them)."""
    parts = ([{"type": "image"}] * num_images + [{"type": "text", "text": VIDEO_TEXT}] * num_videos
             + [{"type": "text", "text": text}])
    return render_chat(tokenizer, [{"role": "user", "content": parts}])


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest("this model has no chat template; use /v1/completions or /generate with raw text")
    if continue_final_message and (add_generation_prompt or messages[-1]["role"] != "assistant"):
        raise InvalidRequest("continue_final_message needs add_generation_prompt false and an assistant message last")
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             continue_final_message=continue_final_message)
    except Exception as e:  # jinja's TemplateError, or a template's raise_exception on bad role order
        raise InvalidRequest(f"the chat template rejected the messages: {e}") from None


def _content(message: ChatMessage, index: int, prompt: ChatPrompt) -> str | list[dict]:
    content = message.content
    if content is None:
        if message.role != "assistant":
            raise InvalidRequest(f"messages[{index}].content is required for role {message.role!r}")
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text})
            continue
        if message.role != "user":
            raise InvalidRequest(f"messages[{index}]: image_url and video_url parts are only allowed in user messages")
        if isinstance(part, ImagePart):
            prompt.images.append(_media(part.image_url, part.uuid, "image_url", index))
            parts.append({"type": "image"})
        elif isinstance(part, VideoPart):
            prompt.videos.append(_media(part.video_url, part.uuid, "video_url", index))
            parts.append({"type": "text", "text": VIDEO_TEXT})
    return parts


def _media(url: MediaURL | None, uuid: str | None, kind: str, index: int) -> str | MediaRef:
    """The part's source: its URL, or a MediaRef where it carries a uuid (with or without data)."""
    if url is None and uuid is None:
        raise InvalidRequest(f"messages[{index}]: a {kind} part needs {kind}.url or a uuid sent before",
                             param=f"messages[{index}].content")
    if uuid is None:
        return url.url
    return MediaRef(url.url if url is not None else None, uuid)
