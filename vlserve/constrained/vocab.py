"""The bytes each token id stands for, read from a Hugging Face fast tokenizer.

Constraints are matched on bytes, so every token needs its exact byte string:
- byte-level BPE (GPT-2, Llama 3, Qwen): token strings use the GPT-2 byte-to-unicode alphabet;
- SentencePiece-style BPE (Llama 2, LLaVA 1.5): `▁` is a space and `<0xNN>` is a raw byte;
- anything else: the token decoded alone.
Special tokens (BOS, EOS, pad, image placeholders…) get None: a constraint never emits them;
EOS is handled separately by the automaton.
"""

from __future__ import annotations

import json
from functools import lru_cache


@lru_cache(maxsize=1)
def _gpt2_unicode_to_byte() -> dict[str, int]:
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _decoder_kinds(tokenizer) -> set[str]:
    spec = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    kinds = {spec.get("type", "")}
    for sub in spec.get("decoders", []) or []:
        kinds.add(sub.get("type", ""))
    return kinds


def _byte_level(token: str) -> bytes | None:
    table = _gpt2_unicode_to_byte()
    if not all(ch in table for ch in token):
        return None
    return bytes(table[ch] for ch in token)


def _sentencepiece(token: str) -> bytes:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("▁", " ").encode("utf-8")


def token_bytes_table(tokenizer) -> list[bytes | None]:
    """Index i holds the bytes of token id i, or None for special and unused ids."""
    size = len(tokenizer)
    table: list[bytes | None] = [None] * size
    special = set(tokenizer.all_special_ids)
    special.update(
        tid for tid, tok in tokenizer.added_tokens_decoder.items() if getattr(tok, "special", False)
    )
    kinds = _decoder_kinds(tokenizer)
    for token, tid in tokenizer.get_vocab().items():
        if tid >= size or tid in special:
            continue
        if "ByteLevel" in kinds:
            table[tid] = _byte_level(token)
        elif "ByteFallback" in kinds or "Metaspace" in kinds:
            table[tid] = _sentencepiece(token)
        else:
            table[tid] = tokenizer.convert_tokens_to_string([token]).encode("utf-8")
        if table[tid] == b"":
            table[tid] = None
    return table


def eos_token_ids(tokenizer) -> list[int]:
    """EOS id(s): the tokenizer's eos_token_id plus a generation_config-style list if present."""
    ids = tokenizer.eos_token_id
    found = list(ids) if isinstance(ids, (list, tuple)) else ([] if ids is None else [ids])
    if not found:
        raise ValueError("tokenizer has no eos_token_id; constrained decoding needs one to stop")
    return sorted(set(found))
