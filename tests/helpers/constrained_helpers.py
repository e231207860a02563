"""Shared by tests/test_constrained_*.py: a tiny byte-level BPE tokenizer trained on a few KB
of JSON-ish and English text, and a decoding loop that drives a ConstraintState like the engine."""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import torch

WORDS = (
    "the a of and to in is it that was for on are with as his they be at one have this from or "
    "had by word but what some we can out other were all there when up use your how said an each "
    "she which do their time if will way about many then them write would like so these her long "
    "make thing see him two has look more day could go come did number sound no most people my "
    "over know water than call first who may down side been now find name age email city house "
    "student order item price status true false null Alice Bob Paris London image video answer"
).split()


def training_corpus(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    words = WORDS + ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(600)]
    lines = []
    for _ in range(150):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(5, 14))) + ".")
    for _ in range(60):
        obj = {rng.choice(words): rng.choice([rng.choice(words), rng.randint(0, 999), True, None])
               for _ in range(rng.randint(1, 4))}
        lines.append(json.dumps(obj))
    lines.append('{"name": "Alice", "age": 30, "is_student": false, "email": "alice@example.com"}')
    lines.append("Café crème, naïve señor — 東京 😀 ünïcödé.")
    return lines


def train_tokenizer(vocab_size: int = 2000):
    """Trained once per machine and cached as JSON in the temp dir (about 1 s to train)."""
    from tokenizers import Tokenizer

    from vlserve.testing.bpe import train_byte_level_bpe
    from transformers import PreTrainedTokenizerFast

    path = Path(tempfile.gettempdir()) / f"vlserve_constrained_bpe_{vocab_size}_v1.json"
    if path.exists():
        return PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_file(str(path)), bos_token="<s>", eos_token="</s>"
        )

    tok = train_byte_level_bpe(training_corpus(), vocab_size, ["<s>", "</s>"])
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def decode_bytes(tokenizer, ids: list[int]) -> bytes:
    from vlserve.constrained.vocab import token_bytes_table

    table = token_bytes_table(tokenizer)
    return b"".join(table[i] for i in ids)


def apply_jump(state, output: list[int]):
    """propose_jump, then the one apply the scheduler makes (the state walks the new tail)."""
    from vlserve.constrained import propose_jump

    jf = propose_jump(state, output)
    if jf is not None:
        state.replace_tail(jf.keep_len, jf.new_output_ids[jf.keep_len:])
    return jf


def walked(compiled, ids: list[int]):
    """A fresh state advanced through ids: what a state that saw exactly these tokens must equal."""
    from vlserve.constrained import ConstraintState

    state = ConstraintState(compiled)
    for tid in ids:
        state.advance(tid)
    return state


def run_decode(compiled, pick, jump: bool, max_steps: int = 200, vocab_size: int | None = None):
    """Drive one request: mask → pick → advance → try_jump_forward, as the engine does.

    pick(text_bytes, allowed_bool_row) -> token id. Returns (output_ids, finished, n_jumps)."""
    from vlserve.constrained import ConstraintState, apply_constraint_masks

    state = ConstraintState(compiled)
    n = vocab_size or compiled.vocab.size
    output: list[int] = []
    jumps = 0
    for _ in range(max_steps):
        if state.is_terminated():
            return output, True, jumps
        logits = torch.zeros(1, n)
        apply_constraint_masks(logits, [state])
        allowed = logits[0] > float("-inf")
        token = pick(b"".join(compiled.vocab.token_bytes[t] for t in output), allowed)
        assert allowed[token], "picked a masked token"
        state.advance(token)
        if token in compiled.vocab.eos_ids:
            return output, True, jumps
        output.append(token)
        if jump:
            jf = apply_jump(state, output)
            if jf is not None:
                table = compiled.vocab.token_bytes
                old_text = b"".join(table[t] for t in output).decode("utf-8", errors="ignore")
                new_text = b"".join(table[t] for t in jf.new_output_ids).decode("utf-8")
                assert new_text == old_text + jf.jumped_text and len(jf.jumped_text) >= 2
                assert jf.new_output_ids[: jf.keep_len] == output[: jf.keep_len]
                output = jf.new_output_ids
                assert state.num_tokens == len(output)
                fresh = walked(compiled, output)  # the state is exactly a walk of the new ids
                assert (fresh.token_states, fresh.byte_states) == (state.token_states, state.byte_states)
                jumps += 1
    return output, state.is_terminated(), jumps
