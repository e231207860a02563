"""Sampling parameters of one request, validated once at submission."""

import json
import re
from dataclasses import dataclass, field, fields

from vlserve.core.errors import InvalidRequest
from vlserve.core.sglang_params import normalise_sglang_names

GREEDY_TEMPERATURE = 1e-5  # temperatures below this sample greedily
MAX_STOP_REGEX, MAX_STOP_REGEX_CHARS = 32, 256  # as SGLang's
INT32_END = 2**31  # token ids and token counts become int32/int64 tensors and list indices
FLOAT32_MAX = 3.4028234663852886e38  # sampling floats scale float32 logits
FLOAT32_TINY = 1.1754943508222875e-38  # below this a float32 divisor is subnormal or zero


@dataclass
class SamplingParams:
    max_new_tokens: int = 128  # 0 = prefill and cache only (SGLang's prefix hint)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0  # subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # divides positive (multiplies negative) logits of prompt and output tokens
    min_new_tokens: int = 0  # EOS and stop_token_ids are masked, stop strings ignored, until this many
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id → added to its logit (OpenAI's)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # SGLang's; a fast tokenizer's decode puts none either way
    stop_regex: list[str] = field(default_factory=list)  # stop where the output text matches one (SGLang's)
    no_stop_trim: bool = False  # keep the matched stop string / regex match in the text (SGLang's)

    @classmethod
    def from_dict(cls, d: dict | None) -> "SamplingParams":
        d = normalise_sglang_names(dict(d or {}))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidRequest(f"unknown sampling parameter(s) {unknown}; known: {sorted(known)}")
        for name in ("stop", "stop_regex"):
            if isinstance(d.get(name), str):
                d[name] = [d[name]]
        if d.get("json_schema") is not None and not isinstance(d["json_schema"], str):
            d["json_schema"] = json.dumps(d["json_schema"])
        params = cls(**{k: v for k, v in d.items() if v is not None or k in ("seed", "regex", "json_schema")})
        params.validate()
        params.check_sglang_fields()
        return params

    def check_sglang_fields(self) -> None:
        """The fields SGLang's /generate added (validate() checks the rest)."""
        for name in ("spaces_between_special_tokens", "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequest(f"{name} must be a boolean")
        if not (isinstance(self.stop_regex, list) and all(isinstance(r, str) and r for r in self.stop_regex)):
            raise InvalidRequest("stop_regex must be a string or a list of non-empty strings")
        if len(self.stop_regex) > MAX_STOP_REGEX:
            raise InvalidRequest(f"stop_regex holds {len(self.stop_regex)} patterns, "
                                 f"over the limit of {MAX_STOP_REGEX}")
        for pattern in self.stop_regex:
            if len(pattern) > MAX_STOP_REGEX_CHARS:
                raise InvalidRequest(f"a stop_regex pattern is {len(pattern)} characters, over {MAX_STOP_REGEX_CHARS}")
            try:
                re.compile(pattern)
            except re.error as e:
                raise InvalidRequest(f"stop_regex {pattern!r} is not a valid regular expression: {e}") from None

    def validate(self) -> None:
        """Every value in the range the engine computes with: ints within int32 (ids, counts) or the
        generator's seed range, floats finite and within float32 (the dtype of the logits they scale)."""
        def need(ok: bool, param: str, msg: str):
            if not ok:
                raise InvalidRequest(f"{param} {msg}", param=param)

        need(_is_int(self.max_new_tokens) and 0 <= self.max_new_tokens < INT32_END, "max_new_tokens",
             f"must be an integer in [0, 2**31), got {self.max_new_tokens!r}")
        need(_within(self.temperature, 0, FLOAT32_MAX), "temperature",
             f"must be a finite number in [0, {FLOAT32_MAX:.4g}] (float32), got {self.temperature!r}")
        need(_within(self.top_p, 0, 1) and self.top_p > 0, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        need(_is_int(self.top_k) and (self.top_k == -1 or 1 <= self.top_k < INT32_END), "top_k",
             f"must be -1 or in [1, 2**31), got {self.top_k!r}")
        need(_within(self.min_p, 0, 1), "min_p", f"must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            need(_within(value, -2, 2), name, f"must be in [-2, 2], got {value!r}")
        need(_within(self.repetition_penalty, FLOAT32_TINY, 2), "repetition_penalty",
             f"must be in (0, 2] and at least {FLOAT32_TINY:.4g} (float32's smallest normal), "
             f"got {self.repetition_penalty!r}")
        need(_is_int(self.min_new_tokens) and 0 <= self.min_new_tokens <= self.max_new_tokens, "min_new_tokens",
             f"must be an integer in [0, max_new_tokens], got {self.min_new_tokens!r}")
        need(isinstance(self.logit_bias, dict) and all(_within(b, -100, 100) for b in self.logit_bias.values()),
             "logit_bias", "must map token ids to numbers in [-100, 100]")
        try:
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()}
        except ValueError:
            raise InvalidRequest("logit_bias keys must be token ids", param="logit_bias") from None
        need(all(0 <= t < INT32_END for t in self.logit_bias), "logit_bias", "keys must be token ids in [0, 2**31)")
        need(isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop), "stop",
             "must be a string or a list of non-empty strings")
        need(isinstance(self.stop_token_ids, list)
             and all(_is_int(t) and 0 <= t < INT32_END for t in self.stop_token_ids),
             "stop_token_ids", "must be a list of token ids in [0, 2**31)")
        need(isinstance(self.ignore_eos, bool), "ignore_eos", "must be a boolean")
        need(isinstance(self.skip_special_tokens, bool), "skip_special_tokens", "must be a boolean")
        need(self.seed is None or (_is_int(self.seed) and -2**63 <= self.seed < 2**64), "seed",
             f"must be an integer in [-2**63, 2**64), got {self.seed!r}")
        need(self.regex is None or isinstance(self.regex, str), "regex", "must be a string")
        need(not (self.regex and self.json_schema), "regex", "and json_schema: give one, not both")

    @property
    def penalised(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows float32 to inf and softmax gives NaN.
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _within(x, lo: float, hi: float) -> bool:
    """A number in [lo, hi]: NaN compares false, inf and ints past any float are out of range."""
    return _is_num(x) and lo <= x <= hi
