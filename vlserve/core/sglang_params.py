"""SGLang's sampling parameter names that vlserve's SamplingParams does not hold as fields.

SGLang's clients send every field of its SamplingParams (the frontend's `to_srt_kwargs` sends `n`,
`stop_regex`, `spaces_between_special_tokens`, … with their defaults). Those whose default means
"nothing happens" are accepted at that default and dropped; a value vlserve cannot honour is refused
by name. `sampling_seed` is SGLang's name for `seed`.
"""

from vlserve.core.errors import InvalidRequest

# name → (the values that mean SGLang's default, why another value is refused)
AT_DEFAULT_ONLY = {
    "n": ((None, 1), "vlserve's /generate returns one sample per prompt: repeat the prompt in a batch for more"),
    "beam_width": ((None, 1), "beam search is not implemented"),
    "ebnf": ((None, ""), "EBNF grammars are not supported: use regex or json_schema"),
    "structural_tag": ((None, ""), "structural tags are not supported: use regex or json_schema"),
    "custom_params": ((None, {}), "custom logit processors are not supported"),
    "watermark": ((None, {}), "watermarking is not supported"),
    "stream_interval": ((None, 1), "send stream_interval with a streamed /generate request"),
}


def normalise_sglang_names(d: dict) -> dict:
    """d with SGLang's defaults of unsupported fields removed and sampling_seed renamed; raises
    InvalidRequest naming a field whose value vlserve cannot honour."""
    for name, (defaults, why) in AT_DEFAULT_ONLY.items():
        if name in d:
            value = d.pop(name)
            if not any(value == ok and type(value) is type(ok) for ok in defaults):
                raise InvalidRequest(f"sampling parameter {name}={value!r} is not supported ({why}); "
                                     f"send it unset or {defaults[-1]!r}")
    if "sampling_seed" in d:
        seed = d.pop("sampling_seed")
        if d.get("seed") is not None and seed is not None and seed != d["seed"]:
            raise InvalidRequest(f"sampling_seed {seed!r} and seed {d['seed']!r} disagree: send one of them")
        if seed is not None:
            d["seed"] = seed
    return d
