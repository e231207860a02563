"""Logprobs as SGLang's /generate returns them (the /generate route and vlserve.lang's Engine backend).

Every entry is [logprob, token id, text]: the text is the token's own decode when the request asked
for return_text_in_logprobs, else null. `input_token_logprobs` lists every prompt position from
logprob_start_len on (position 0 and image positions with a null logprob; an image position's id is
its pseudo token, as /tokenize shows it, its text "<image>"), so its length plus logprob_start_len is
the prompt's token count; with return_logprob and no start it is empty. `output_top_logprobs` and
(with a start) `input_top_logprobs` hold, per token, a list of top_logprobs_num such entries (null for
a prompt position without a logprob).
"""

from vlserve.preprocess import is_pseudo_token

IMAGE_TEXT = "<image>"


def sglang_logprobs(meta: dict, tokenizer=None) -> dict:
    """meta with the engine's (logprob, id) pairs rewritten as SGLang's entries (in place)."""
    if "output_token_logprobs" not in meta:
        return meta
    meta.setdefault("input_token_logprobs", [])
    for key in ("input_token_logprobs", "output_token_logprobs"):
        meta[key] = _entries(meta[key], tokenizer)
    for key in ("input_top_logprobs", "output_top_logprobs"):
        if key in meta:
            meta[key] = [None if top is None else _entries(top, tokenizer) for top in meta[key]]
    return meta


def _entries(pairs: list, tokenizer) -> list[list]:
    texts = _texts([tid for _, tid in pairs], tokenizer)
    return [[lp, tid, text] for (lp, tid), text in zip(pairs, texts)]


def _texts(ids: list[int], tokenizer) -> list[str | None]:
    if tokenizer is None:
        return [None] * len(ids)
    vocab = [tid for tid in ids if not is_pseudo_token(tid)]
    decoded = iter(tokenizer.batch_decode([[tid] for tid in vocab], skip_special_tokens=False))
    return [IMAGE_TEXT if is_pseudo_token(tid) else next(decoded) for tid in ids]
