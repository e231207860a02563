"""HTTP sampling options → the engine's sampling_params dict (vlserve.core.sampling_params.SamplingParams.from_dict)."""

import json

from vlserve.server.errors import APIError
from vlserve.server.openai_protocol import ChatCompletionRequest, CompletionRequest, ResponseFormat

DEFAULT_MAX_TOKENS = 128  # when the client gives none; lowered to what fits the context (fit_max_new_tokens)


def openai_sampling(body: ChatCompletionRequest | CompletionRequest) -> tuple[dict, bool]:
    """(sampling_params, fit_max_new_tokens)."""
    max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
    params = {"max_new_tokens": max_tokens or DEFAULT_MAX_TOKENS, "stop": body.stop, "seed": body.seed,
              "temperature": body.temperature, "top_p": body.top_p}
    schema = _schema_of(getattr(body, "response_format", None))
    if schema is not None:
        params["json_schema"] = schema
    return {k: v for k, v in params.items() if v is not None}, max_tokens is None


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
