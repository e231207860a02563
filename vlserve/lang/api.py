"""The public statements of the language (SGLang's names and arguments)."""

import re
from typing import Callable

from vlserve.lang.choices import ChoicesSamplingMethod, token_length_normalized
from vlserve.lang.ir import (SglExprList, SglGen, SglImage, SglRoleBegin, SglRoleEnd, SglSamplingParams, SglSelect,
                             SglVideo)


def function(func: Callable | None = None, num_api_spec_tokens: int | None = None):
    """`@function` or `@function(num_api_spec_tokens=N)`."""
    from vlserve.lang.program import SglFunction

    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)


def set_default_backend(backend) -> None:
    from vlserve.lang.backend import as_backend
    from vlserve.lang.global_config import global_config

    global_config.default_backend = as_backend(backend) if backend is not None else None


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None, n: int | None = None,
        stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None, temperature: float | None = None, top_p: float | None = None,
        top_k: int | None = None, min_p: float | None = None, frequency_penalty: float | None = None,
        presence_penalty: float | None = None, ignore_eos: bool | None = None, return_logprob: bool | None = None,
        logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None, dtype=None, choices: list[str] | None = None,
        choices_method: ChoicesSamplingMethod | None = None, regex: str | None = None,
        json_schema: str | dict | None = None):
    """SGLang's gen, argument for argument (its order too)."""
    if choices:
        return SglSelect(name, list(choices), 0.0 if temperature is None else temperature,
                         choices_method or token_length_normalized)
    if regex is not None:
        re.compile(regex)  # a bad regex fails here, in the program, not in the server
    return SglGen(name, SglSamplingParams(
        max_tokens, stop, stop_token_ids, temperature, top_p, top_k, min_p, ignore_eos, regex, json_schema, dtype,
        min_tokens, n, stop_regex, frequency_penalty, presence_penalty, return_logprob, logprob_start_len,
        top_logprobs_num, return_text_in_logprobs))


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs):
    return gen(name, max_tokens, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs):
    return gen(name, max_tokens, dtype=str, **kwargs)


def flush_cache(backend=None) -> bool:
    """Empties the server's cache (SGLang's sgl.flush_cache); False with no backend."""
    backend = _backend(backend)
    return False if backend is None else backend.flush_cache()


def get_server_info(backend=None) -> dict | None:
    """The server's /server_info (SGLang's sgl.get_server_info); None with no backend."""
    backend = _backend(backend)
    return None if backend is None else backend.get_server_info()


def _backend(backend):
    from vlserve.lang.backend import as_backend
    from vlserve.lang.global_config import global_config

    return as_backend(backend) if backend is not None else global_config.default_backend


def select(name: str | None = None, choices: list[str] | None = None, temperature: float = 0.0,
           choices_method: ChoicesSamplingMethod = token_length_normalized):
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    return SglSelect(name, list(choices), temperature, choices_method)


def image(source):
    """An image: a path, bytes or a PIL image."""
    return SglImage(source)


def video(path, num_frames: int):
    return SglVideo(path, num_frames)


def _role(name: str, expr=None):
    if expr is None:
        return SglExprList([SglRoleBegin(name), SglRoleEnd(name)])
    return SglExprList([SglRoleBegin(name), expr, SglRoleEnd(name)])


def system(expr=None):
    return _role("system", expr)


def user(expr=None):
    return _role("user", expr)


def assistant(expr=None):
    return _role("assistant", expr)


def system_begin():
    return SglRoleBegin("system")


def system_end():
    return SglRoleEnd("system")


def user_begin():
    return SglRoleBegin("user")


def user_end():
    return SglRoleEnd("user")


def assistant_begin():
    return SglRoleBegin("assistant")


def assistant_end():
    return SglRoleEnd("assistant")
