"""Any OpenAI-compatible server as a backend (vlserve's own /v1 included), with API speculative
execution (paper §5) for programs declared with @function(num_api_spec_tokens=N).

Completion models: see spec.py. Chat models: the assistant turn's constants and gens are collected
(chat_spec.py) and filled from one chat call at the turn's end, retried up to spec_max_num_tries
times; if the answer never follows the template, each gen is an ordinary call that continues the
partial assistant message (continue_final_message, as vLLM and SGLang servers take it).
"""

import json
import os
import threading
from dataclasses import dataclass, field

from vlserve.lang.backend.base import BaseBackend
from vlserve.lang.chat_template import DEFAULT
from vlserve.lang.spec import spec_max_tokens


@dataclass
class TokenUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, usage) -> None:
        with self._lock:
            self.calls += 1
            if usage is not None:
                self.prompt_tokens += usage.prompt_tokens
                self.completion_tokens += usage.completion_tokens

    def reset(self) -> None:
        with self._lock:
            self.prompt_tokens = self.completion_tokens = self.calls = 0


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    completion_tokens: int


class OpenAI(BaseBackend):
    def __init__(self, model_name: str, is_chat_model: bool | None = None, chat_template=None, tokenizer=None,
                 spec_max_num_tries: int = 3, **client_kwargs):
        import openai

        client_kwargs.setdefault("api_key", os.environ.get("OPENAI_API_KEY") or "EMPTY")
        self.client = openai.OpenAI(**client_kwargs)
        self.model_name = model_name
        self.is_chat_model = True if is_chat_model is None else is_chat_model
        self.chat_template = chat_template or DEFAULT
        self.chat_prefix = self.chat_template.role_prefix_and_suffix["assistant"][0]
        self.tokenizer = _load_tokenizer(tokenizer)
        self.spec_max_num_tries = spec_max_num_tries
        self.token_usage = TokenUsage()

    # ---- calls -----------------------------------------------------------------------------------
    def complete(self, prompt: str, **kwargs) -> Completion:
        ret = self.client.completions.create(model=self.model_name, prompt=prompt, **kwargs)
        self.token_usage.add(ret.usage)
        choice = ret.choices[0]
        return Completion(choice.text, choice.finish_reason, ret.usage.completion_tokens if ret.usage else 0)

    def chat(self, messages: list[dict], **kwargs) -> str:
        ret = self.client.chat.completions.create(model=self.model_name, messages=messages, **kwargs)
        self.token_usage.add(ret.usage)
        return ret.choices[0].message.content or ""

    # ---- the interpreter's calls -----------------------------------------------------------------
    def generate(self, s, sampling_params) -> tuple[str, dict]:
        kwargs = self._kwargs(sampling_params)
        if self.is_chat_model:
            self._check_chat_position(s)
            return self.chat(s.messages_, **kwargs), {}
        self._check_no_media(s)
        if s.num_api_spec_tokens is not None:
            return self._speculative_completion(s, sampling_params), {}
        return self.complete(s.text_, **kwargs).text, {}

    def generate_stream(self, s, sampling_params):
        kwargs = {**self._kwargs(sampling_params), "stream": True, "stream_options": {"include_usage": True}}
        if self.is_chat_model:
            self._check_chat_position(s)
            chunks = self.client.chat.completions.create(model=self.model_name, messages=s.messages_, **kwargs)
        else:
            self._check_no_media(s)
            chunks = self.client.completions.create(model=self.model_name, prompt=s.text_, **kwargs)
        usage = None
        for chunk in chunks:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                piece = choice.delta.content if self.is_chat_model else choice.text
                if piece:
                    yield piece, {}
        self.token_usage.add(usage)

    def select(self, s, choices, temperature, choices_method):
        raise NotImplementedError("select needs prompt logprobs, which the OpenAI API does not return; "
                                  "run the program on vlserve (Engine or RuntimeEndpoint)")

    def role_end_generate(self, s) -> None:
        turn = s.chat_spec
        gens = turn.gens()
        if not gens:
            return
        kwargs = {**self._kwargs(gens[0].params), "max_tokens": s.num_api_spec_tokens}
        kwargs.pop("stop", None)
        for _ in range(self.spec_max_num_tries):
            if turn.match(self.chat(s.messages_, **kwargs)):
                return
        self._fill_turn_call_by_call(s, turn)

    # ---- speculative execution -------------------------------------------------------------------
    def _speculative_completion(self, s, params) -> str:
        stop, limit = params.stop_list(), params.max_new_tokens
        value = s.speculation.take(stop, limit, self.tokenizer)
        if value is None:  # nothing speculated, or not enough: speculate from the true text
            kwargs = self._kwargs(params)
            kwargs.pop("stop", None)
            kwargs["max_tokens"] = spec_max_tokens(s.num_api_spec_tokens, limit, bool(stop))
            got = self.complete(s.text_, **kwargs)
            s.speculation.fill(got.text, got.completion_tokens, ended=got.finish_reason == "stop")
            value = s.speculation.take(stop, limit, self.tokenizer)
        if value is None:  # the speculation cannot decide this gen: an ordinary call
            s.speculation.clear()
            value = self.complete(s.text_, **self._kwargs(params)).text
        return value

    def _fill_turn_call_by_call(self, s, turn) -> None:
        partial = ""
        for term in turn.terms:
            if term.is_gen:
                messages, extra = s.messages_, {}
                if partial:
                    messages = messages + [{"role": "assistant", "content": partial}]
                    extra = {"extra_body": {"continue_final_message": True, "add_generation_prompt": False}}
                term.text = self.chat(messages, **self._kwargs(term.params), **extra)
            partial += term.text

    # ---- helpers ---------------------------------------------------------------------------------
    def _kwargs(self, params) -> dict:
        if params.regex is not None or params.dtype is not None:
            raise ValueError("regex and dtype constraints need vlserve's native API (Engine or RuntimeEndpoint)")
        kwargs = params.to_openai()
        if params.json_schema is not None:
            if not self.is_chat_model:
                raise ValueError("json_schema with the OpenAI backend needs a chat model (response_format)")
            schema = params.json_schema
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": schema if isinstance(schema, dict) else json.loads(schema)}}
        return kwargs

    def _check_chat_position(self, s) -> None:
        if not s.text_.endswith(self.chat_prefix):
            raise RuntimeError("with an OpenAI chat model, gen must come right after assistant begins "
                               "(or declare @function(num_api_spec_tokens=N) for a templated turn)")

    @staticmethod
    def _check_no_media(s) -> None:
        if s.media:
            raise ValueError("images and video need a chat model with the OpenAI backend (is_chat_model=True)")

    def shutdown(self) -> None:
        self.client.close()


def _load_tokenizer(tokenizer):
    """None, an object with encode/decode, or a local Hugging Face tokenizer directory."""
    if tokenizer is None or hasattr(tokenizer, "encode"):
        return tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
