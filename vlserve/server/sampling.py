"""HTTP sampling options → the engine's sampling_params dict (vlserve.core.sampling_params.SamplingParams.from_dict)."""

import json

from vlserve.server.errors import APIError
from vlserve.server.openai_protocol import UNSUPPORTED, ChatCompletionRequest, CompletionRequest, ResponseFormat

# max_tokens absent: what is left of the context (as vLLM does) — the engine lowers this to the room
# the prompt leaves (fit_max_new_tokens)
UP_TO_THE_CONTEXT = 1 << 30
EXTRA_FIELDS = ("top_k", "min_p", "ignore_eos", "stop_token_ids", "regex", "json_schema", "skip_special_tokens",
                "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias")


def openai_sampling(body: ChatCompletionRequest | CompletionRequest) -> tuple[dict, bool]:
    """(sampling_params, fit_max_new_tokens). Refuses documented fields vlserve does not implement."""
    refuse_unsupported(body)
    max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
    if getattr(body, "best_of", None) not in (None, body.n):
        raise APIError(400, f"best_of {body.best_of} is not supported: vlserve returns all n choices it samples",
                       param="best_of", code="unsupported_parameter")
    params = {"max_new_tokens": max_tokens or UP_TO_THE_CONTEXT, "stop": body.stop, "seed": body.seed,
              "temperature": body.temperature, "top_p": body.top_p, "min_new_tokens": body.min_tokens,
              **{k: getattr(body, k) for k in EXTRA_FIELDS}}
    schema = _schema_of(body.response_format)
    if schema is not None:
        if body.json_schema is not None or body.regex is not None:
            raise APIError(400, "give response_format or json_schema/regex, not both", param="response_format")
        params["json_schema"] = schema
    return {k: v for k, v in params.items() if v is not None}, max_tokens is None


def openai_logprob_request(body) -> dict:
    """The engine request fields for the logprobs a chat (logprobs, top_logprobs) or completion
    (logprobs = number of alternatives) request asks for."""
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return {"return_logprob": True, "top_logprobs_num": body.top_logprobs or 0} if body.logprobs else {}
    return {"return_logprob": True, "top_logprobs_num": body.logprobs} if body.logprobs is not None else {}


def refuse_unsupported(body) -> None:
    for name, off in UNSUPPORTED.items():
        value = getattr(body, name, None)
        if value not in off:
            raise APIError(400, f"{name} is not supported by this server (send it unset)", param=name,
                           code="unsupported_parameter")


def per_choice(params: dict, n: int) -> list[dict]:
    """n copies; with a seed, choice i uses seed + i so the choices differ but stay reproducible."""
    if params.get("seed") is None:
        return [params] * n
    return [{**params, "seed": (params["seed"] + i) % 2**64 if i else params["seed"]} for i in range(n)]


def _schema_of(fmt: ResponseFormat | None) -> str | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json.dumps({"type": "object"})
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError(400, "response_format.json_schema.schema is required for type json_schema",
                       param="response_format.json_schema.schema")
    return json.dumps(fmt.json_schema.schema_)
