"""The scripted OpenAI-compatible fake the spec-execution tests count calls on (and nothing else).

Completions: the "model" continues the prompt within one of its documents, a token being a word
with its leading whitespace; a prompt that is no document's prefix gets " unknown\n". Stop strings,
max_tokens and usage are honoured as a real server does.
Chat: the answer to a user message is a character sheet; in "broken" mode the full answer does not
follow the program's template (", " between fields), while a continued partial assistant message
(continue_final_message) gets the right field value.
"""

import re
import threading

from fastapi import FastAPI
from pydantic import BaseModel

TOKEN = re.compile(r"\s*\S+|\s+")


class WordTokenizer:
    """The fake's own tokenisation, for the backend's token counting."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return TOKEN.findall(text)

    def decode(self, ids: list[str]) -> str:
        return "".join(ids)


class CompletionBody(BaseModel):
    model: str
    prompt: str
    max_tokens: int = 16
    stop: str | list[str] | None = None
    temperature: float | None = None


class ChatBody(BaseModel):
    model: str
    messages: list[dict]
    max_tokens: int = 16
    stop: str | list[str] | None = None
    temperature: float | None = None
    continue_final_message: bool = False


def _cut(text: str, max_tokens: int, stop) -> tuple[str, str, int]:
    tokens = TOKEN.findall(text)
    out = "".join(tokens[:max_tokens])
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    cut = min((p for p in (out.find(s) for s in stops) if p >= 0), default=-1)
    if cut >= 0:
        out = out[:cut]
        return out, "stop", len(TOKEN.findall(out))
    return out, "length" if len(tokens) > max_tokens else "stop", min(len(tokens), max_tokens)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class OpenAIFake:
    def __init__(self, documents: list[str], sheet: dict[str, str] | None = None, broken: bool = False):
        self.documents = documents
        self.sheet = sheet or {}
        self.broken = broken
        self.calls = 0
        self.prompt_tokens = 0
        self._lock = threading.Lock()
        self.app = FastAPI()
        self.app.post("/v1/completions")(self.completions)
        self.app.post("/v1/chat/completions")(self.chat)

    def _count(self, prompt_tokens: int) -> None:
        with self._lock:
            self.calls += 1
            self.prompt_tokens += prompt_tokens

    def completions(self, body: CompletionBody) -> dict:
        doc = next((d for d in self.documents if d.startswith(body.prompt)), None)
        rest = doc[len(body.prompt):] if doc is not None else " unknown\n"
        text, reason, n = _cut(rest, body.max_tokens, body.stop)
        prompt_tokens = len(TOKEN.findall(body.prompt))
        self._count(prompt_tokens)
        return {"id": "fake", "object": "text_completion", "created": 0, "model": body.model,
                "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}],
                "usage": _usage(prompt_tokens, n)}

    def chat(self, body: ChatBody) -> dict:
        last = body.messages[-1]
        if body.continue_final_message and last["role"] == "assistant":
            key = next(k for k in self.sheet if last["content"].endswith(k))
            answer = self.sheet[key] + "\n"
        else:
            sep = ", " if self.broken else "\n"
            answer = sep.join(f"{k}{v}" for k, v in self.sheet.items())
        text, reason, n = _cut(answer, body.max_tokens, body.stop)
        prompt_tokens = sum(len(TOKEN.findall(str(m["content"]))) for m in body.messages)
        self._count(prompt_tokens)
        return {"id": "fake", "object": "chat.completion", "created": 0, "model": body.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": reason}],
                "usage": _usage(prompt_tokens, n)}
