"""OpenAI's logprobs objects from the engine's (logprob, id) lists.

chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}
A token's text is its own decode (as vLLM reports it); jump-forward tokens carry logprob 0.0 and no
alternatives (they had no choice).
"""


def chat_logprobs(tokenizer, pairs: list, tops: list) -> dict:
    def entry(logprob: float, tid: int) -> dict:
        text = tokenizer.decode([tid])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = [{**entry(lp, tid), "top_logprobs": [entry(*alt) for alt in (tops[i] if i < len(tops) else [])]}
               for i, (lp, tid) in enumerate(pairs)]
    return {"content": content, "refusal": None}


def completion_logprobs(tokenizer, pairs: list, tops: list, text_offset: int = 0) -> dict:
    tokens, offsets = [], []
    for _, tid in pairs:
        offsets.append(text_offset)
        tokens.append(tokenizer.decode([tid]))
        text_offset += len(tokens[-1])
    top = [{tokenizer.decode([alt]): lp for lp, alt in (tops[i] if i < len(tops) else [])} for i in range(len(pairs))]
    return {"tokens": tokens, "token_logprobs": [lp for lp, _ in pairs], "top_logprobs": top,
            "text_offset": offsets}


def logprobs_of(tokenizer, meta: dict, chat: bool, start: int = 0, text_offset: int = 0) -> dict | None:
    """The logprobs object for output tokens [start, …) of a result's meta_info, or None if not asked."""
    pairs = meta.get("output_token_logprobs")
    if pairs is None:
        return None
    tops = meta.get("output_top_logprobs", [])[start:]
    if chat:
        return chat_logprobs(tokenizer, pairs[start:], tops)
    return completion_logprobs(tokenizer, pairs[start:], tops, text_offset)
