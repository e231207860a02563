"""The program's expressions: what `s += ...` submits to a state's executor.

Names follow SGLang's frontend (SglGen, SglSelect, ...). `a + b` of two expressions (or an
expression and a string) is an SglExprList, executed left to right.
"""

from dataclasses import dataclass, field, fields
from typing import Any

# Regexes a typed gen is constrained by (gen(dtype=...), gen_int, gen_string).
DTYPE_REGEX = {
    int: r"[-+]?[0-9]+",
    float: r"[-+]?[0-9]*\.?[0-9]+",
    bool: r"(True|False)",
    str: r"\"[^\"\n]*\"",
}
REQUEST_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")
_DTYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str, "string": str}


def dtype_regex(dtype) -> str | None:
    if dtype is None:
        return None
    kind = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if kind not in DTYPE_REGEX:
        raise ValueError(f"unknown dtype {dtype!r}; use int, float, bool or str")
    return DTYPE_REGEX[kind]


@dataclass
class SglSamplingParams:
    """A gen's sampling parameters; None = take the program's default (run(..., temperature=...))."""
    max_new_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    ignore_eos: bool | None = None
    regex: str | None = None
    json_schema: str | dict | None = None
    dtype: Any = None
    min_new_tokens: int | None = None
    n: int | None = None
    stop_regex: str | list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    # request fields, not sampling ones: the gen's logprobs (SGLang's names and meaning)
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None

    def merged_over(self, default: "SglSamplingParams") -> "SglSamplingParams":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return SglSamplingParams(**{k: v if v is not None else getattr(default, k) for k, v in values.items()})

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def to_runtime(self) -> dict:
        """vlserve's native sampling_params (the /generate route and Engine.generate)."""
        regex = self.regex if self.regex is not None else dtype_regex(self.dtype)
        out = {"max_new_tokens": self.max_new_tokens, "stop": self.stop_list() or None,
               "stop_token_ids": self.stop_token_ids, "temperature": self.temperature, "top_p": self.top_p,
               "top_k": self.top_k, "min_p": self.min_p, "ignore_eos": self.ignore_eos, "regex": regex,
               "json_schema": self.json_schema, "min_new_tokens": self.min_new_tokens, "n": self.n,
               "stop_regex": self.stop_regex or None, "frequency_penalty": self.frequency_penalty,
               "presence_penalty": self.presence_penalty}
        return {k: v for k, v in out.items() if v is not None}

    def request_fields(self) -> dict:
        """The logprob fields a gen sets, for the request body beside sampling_params."""
        out = {name: getattr(self, name) for name in REQUEST_FIELDS}
        return {k: v for k, v in out.items() if v is not None}

    def to_openai(self) -> dict:
        out = {"max_tokens": self.max_new_tokens, "stop": self.stop_list() or None,
               "temperature": self.temperature, "top_p": self.top_p}
        return {k: v for k, v in out.items() if v is not None}


def default_sampling_params(**overrides) -> SglSamplingParams:
    """The program-wide defaults (SGLang's): 128 new tokens, temperature 1, no stop."""
    base = SglSamplingParams(max_new_tokens=128, stop=[], stop_token_ids=[], temperature=1.0, top_p=1.0,
                             top_k=-1, min_p=0.0, ignore_eos=False)
    return SglSamplingParams(**overrides).merged_over(base)


class SglExpr:
    def __add__(self, other):
        return SglExprList([self, _as_expr(other)])

    def __radd__(self, other):
        return SglExprList([_as_expr(other), self])


def _as_expr(value) -> "SglExpr":
    if isinstance(value, SglExpr):
        return value
    if isinstance(value, str):
        return SglConstantText(value)
    raise TypeError(f"cannot add {type(value).__name__} to an LM program; use a string or an expression")


@dataclass(eq=False)
class SglExprList(SglExpr):
    expr_list: list

    def __add__(self, other):
        return SglExprList(self.expr_list + [_as_expr(other)])

    def __radd__(self, other):
        return SglExprList([_as_expr(other)] + self.expr_list)


@dataclass(eq=False)
class SglConstantText(SglExpr):
    value: str


@dataclass(eq=False)
class SglGen(SglExpr):
    name: str | None
    sampling_params: SglSamplingParams = field(default_factory=SglSamplingParams)


@dataclass(eq=False)
class SglSelect(SglExpr):
    name: str | None
    choices: list[str]
    temperature: float
    choices_method: Any


@dataclass(eq=False)
class SglImage(SglExpr):
    source: Any  # a path, bytes or a PIL image


@dataclass(eq=False)
class SglVideo(SglExpr):
    source: Any  # a path or bytes
    num_frames: int


@dataclass(eq=False)
class SglRoleBegin(SglExpr):
    role: str


@dataclass(eq=False)
class SglRoleEnd(SglExpr):
    role: str


@dataclass(eq=False)
class SglVarScopeBegin(SglExpr):
    name: str


@dataclass(eq=False)
class SglVarScopeEnd(SglExpr):
    name: str


@dataclass(eq=False)
class SglCommitLazy(SglExpr):
    """Send the state's text and media so far with max_new_tokens=0 (the fork hint)."""


@dataclass(eq=False)
class SglConcateAndAppend(SglExpr):
    states: list


def variable_names(expr) -> list[str]:
    """Names an expression will set (s[name] waits for them)."""
    if isinstance(expr, (SglGen, SglSelect, SglVarScopeBegin)) and expr.name is not None:
        return [expr.name]
    if isinstance(expr, SglExprList):
        return [n for e in expr.expr_list for n in variable_names(e)]
    return []
