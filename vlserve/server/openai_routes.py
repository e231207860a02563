"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions (plain and SSE streams)."""

import time
from dataclasses import dataclass

from fastapi import APIRouter, Request

from vlserve.server.auth import media_scope
from vlserve.server.chat import build_chat_prompt
from vlserve.server.disconnect import cancel_on_disconnect
from vlserve.server.errors import APIError, ErrorMappingRoute, error_event, raise_if_failed
from vlserve.server.fanout import MergedStream, generate_all, open_streams
from vlserve.server.openai_protocol import (ChatCompletionRequest, CompletionRequest, envelope, finish_reason,
                                            new_id, usage_of)
from vlserve.server.openai_logprobs import logprobs_of
from vlserve.server.sampling import openai_logprob_request, openai_sampling, per_choice
from vlserve.server.sse import DONE, SSEResponse, event

MAX_PROMPTS = 64  # prompts in one /v1/completions batch
MAX_CHOICES = 64  # prompts x n: engine requests made for one HTTP request


@dataclass(frozen=True)
class ChoiceFormat:
    """How one choice's text appears: chat messages / deltas, or completion text (echo: prompt first)."""
    chat: bool
    tokenizer: object = None
    echo: tuple[str, ...] = ()  # per prompt, with echo on a completion
    n: int = 1

    @property
    def object_type(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    @property
    def chunk_type(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def prefix(self, index: int) -> str:
        return self.echo[index // self.n] if self.echo else ""

    def final(self, index: int, result: dict) -> dict:
        text = self.prefix(index) + result["text"]
        body = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        logprobs = logprobs_of(self.tokenizer, result["meta_info"], self.chat, text_offset=len(self.prefix(index)))
        return {"index": index, **body, "logprobs": logprobs, "finish_reason": finish_reason(result["meta_info"])}

    def delta(self, index: int, text: str, reason: str | None, role: bool = False,
              logprobs: dict | None = None) -> dict:
        if self.chat:
            body = {"delta": ({"role": "assistant"} if role else {}) | ({"content": text} if text or role else {})}
        else:
            body = {"text": text}
        return {"index": index, **body, "logprobs": logprobs, "finish_reason": reason}


def openai_router(engine, model_names: list[str]) -> APIRouter:
    model_name = model_names[0]  # the name answers carry
    router = APIRouter(route_class=ErrorMappingRoute)

    @router.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                            "owned_by": "vlserve", "max_model_len": engine.context_len}
                                           for name in model_names]}

    def check_model(body) -> None:
        if body.model is not None and body.model not in model_names:
            raise APIError(404, f"the model `{body.model}` does not exist: this server serves `{model_name}` "
                                "(GET /v1/models)", param="model", code="model_not_found")

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        check_model(body)
        prompt = build_chat_prompt(engine.tokenizer, body.messages, body.add_generation_prompt,
                                   body.continue_final_message)
        params, fit = openai_sampling(body)
        base = {"prompt": prompt.text, "image_data": prompt.images or None, "video_data": prompt.videos or None,
                "fit_max_new_tokens": fit, "media_scope": media_scope(request), **openai_logprob_request(body),
                **body.media_options()}
        jobs = [{**base, "sampling_params": p} for p in per_choice(params, body.n)]
        fmt = ChoiceFormat(chat=True, tokenizer=engine.tokenizer, n=body.n)
        return await _respond(engine, request, body, jobs, fmt, model_name, prompts=1)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_model(body)
        prompts = _completion_prompts(body.prompt)
        params, fit = openai_sampling(body)
        if len(prompts) * body.n > MAX_CHOICES:
            raise APIError(400, f"{len(prompts)} prompts x n={body.n} is over the limit of {MAX_CHOICES} choices",
                           param="n")
        jobs = [{**prompt, "sampling_params": p, "fit_max_new_tokens": fit, **openai_logprob_request(body),
                 **body.media_options()}
                for prompt in prompts for p in per_choice(params, body.n)]
        echo = tuple(_prompt_text(engine.tokenizer, p) for p in prompts) if body.echo else ()
        fmt = ChoiceFormat(chat=False, tokenizer=engine.tokenizer, echo=echo, n=body.n)
        return await _respond(engine, request, body, jobs, fmt, model_name, prompts=len(prompts))

    return router


async def _respond(engine, request: Request, body, jobs: list[dict], fmt: ChoiceFormat, model: str, prompts: int):
    rid = new_id("chatcmpl" if fmt.chat else "cmpl")
    if body.stream:
        merged = await open_streams(engine, jobs)  # refusals raise here, before any byte is sent
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(_events(merged, fmt, rid, model, len(jobs), prompts, include_usage))
    results = await cancel_on_disconnect(request, generate_all(engine, jobs))
    for r in results:
        raise_if_failed(r)
    choices = [fmt.final(i, r) for i, r in enumerate(results)]
    return envelope(fmt.object_type, rid, model, choices, usage=usage_of(results, prompts))


async def _events(merged: MergedStream, fmt: ChoiceFormat, rid: str, model: str, total: int, prompts: int,
                  include_usage: bool):
    extra = {"usage": None} if include_usage else {}
    finals: list[dict | None] = [None] * total
    sent = [0] * total  # output tokens whose logprobs were sent, per choice
    try:
        if fmt.chat:
            yield event(envelope(fmt.chunk_type, rid, model, [fmt.delta(i, "", None, role=True) for i in range(total)],
                                 **extra))
        elif fmt.echo:
            yield event(envelope(fmt.chunk_type, rid, model, [fmt.delta(i, fmt.prefix(i), None) for i in range(total)],
                                 **extra))
        async for index, chunk in merged:
            if chunk.get("error"):
                yield event(error_event(chunk))
                break
            reason = finish_reason(chunk["meta_info"]) if chunk["finished"] else None
            if chunk["delta"] or reason:
                logprobs = logprobs_of(fmt.tokenizer, chunk["meta_info"], fmt.chat, start=sent[index])
                sent[index] = len(chunk["output_ids"])
                yield event(envelope(fmt.chunk_type, rid, model, [fmt.delta(index, chunk["delta"], reason,
                                                                             logprobs=logprobs)], **extra))
            if chunk["finished"]:
                finals[index] = chunk
        else:
            if include_usage:
                yield event(envelope(fmt.chunk_type, rid, model, [], usage=usage_of(finals, prompts)))
        yield DONE
    finally:
        await merged.aclose()


def _prompt_text(tokenizer, prompt: dict) -> str:
    return prompt["prompt"] if "prompt" in prompt else tokenizer.decode(prompt["input_ids"])


def _completion_prompts(prompt) -> list[dict]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    if isinstance(prompt, str):
        return [{"prompt": prompt}]
    if not prompt:
        raise APIError(400, "prompt is empty", param="prompt")
    if len(prompt) > MAX_PROMPTS and not all(isinstance(t, int) for t in prompt):
        raise APIError(400, f"prompt has {len(prompt)} prompts, over the limit of {MAX_PROMPTS} per request",
                       param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return [{"prompt": p} for p in prompt]
    if all(isinstance(t, int) for t in prompt):
        return [{"input_ids": list(prompt)}]
    return [{"input_ids": list(ids)} for ids in prompt]
