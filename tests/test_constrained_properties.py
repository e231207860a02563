"""Property tests: random regexes and JSON schemas, decoded with jump-forward on and off.

- A random "model" (seeded random choice among allowed tokens): every finished output matches its
  regex (re.fullmatch) or parses as JSON and validates against its schema, in both modes.
- A greedy deterministic model whose preferences are a fixed function of the text so far: it
  follows its preferred character path, taking the longest allowed token along it. Jump-forward
  only skips characters the constraint forced, so both modes must produce the same text.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re

import jsonschema
import pytest
import torch
from helpers.constrained_helpers import WORDS, run_decode, train_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlserve.constrained import ConstraintCompiler, ConstraintState

TOKENIZER = train_tokenizer()
COMPILER = ConstraintCompiler(TOKENIZER)
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("VLSERVE_HYPOTHESIS_EXAMPLES", 40)), deadline=None,
    suppress_health_check=[HealthCheck.too_slow], derandomize=os.environ.get("VLSERVE_HYPOTHESIS_RANDOM") is None
)

# ---- random regexes: literals, classes, alternation, bounded repetition ----------------------

LITERAL_CHARS = "abcxyz019 -_:,.\"{}é"
CLASSES = ["[abc]", "[a-f]", "[0-9]", "[xyz0-3]", "[^a-y]"]  # no \d: Rust knows newer Unicode digits


def _literal():
    return st.text(LITERAL_CHARS, min_size=1, max_size=6).map(re.escape)


def _atom(inner):
    return st.one_of(
        _literal(),
        st.sampled_from(CLASSES),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + "|".join(xs) + ")"),
        st.tuples(inner, st.integers(0, 2), st.integers(0, 2)).map(
            lambda t: f"({t[0]}){{{t[1]},{t[1] + t[2]}}}"
        ),
    )


REGEXES = st.recursive(
    st.one_of(_literal(), st.sampled_from(CLASSES)),
    lambda inner: st.lists(_atom(inner), min_size=1, max_size=4).map("".join),
    max_leaves=8,
)

# ---- random JSON schemas: objects of string / integer / boolean / enum fields ----------------

FIELD = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.just({"type": "integer"}),
    st.just({"type": "boolean"}),
    st.lists(st.sampled_from(WORDS[:40]), min_size=1, max_size=3, unique=True).map(
        lambda xs: {"enum": xs}
    ),
)


@st.composite
def schemas(draw):
    names = draw(st.lists(st.sampled_from(WORDS[40:120]), min_size=1, max_size=4, unique=True))
    props = {name: draw(FIELD) for name in names}
    required = [n for n in names if draw(st.booleans())]
    return {"type": "object", "properties": props, "required": required}


# ---- models ----------------------------------------------------------------------------------


def random_model(seed: int):
    rng = random.Random(seed)

    def pick(text: bytes, allowed: torch.Tensor) -> int:
        ids = allowed.nonzero().view(-1).tolist()
        eos = [i for i in ids if i == TOKENIZER.eos_token_id]
        return eos[0] if eos and rng.random() < 0.3 else rng.choice(ids)

    return pick


def _preference(text: bytes, choice: int) -> float:
    digest = hashlib.blake2b(text + b"\xff" + choice.to_bytes(2, "little"), digest_size=8).digest()
    score = int.from_bytes(digest, "little") / 2**64
    # favour ending things (EOS, closing quotes, separators) so outputs stay short
    return score + (0.6 if choice == 256 else 0.4 if choice in b'",}' else 0.0)


def greedy_text_model(compiled):
    """Preferences fixed per text: the next character after text T is the preferred one among
    those the constraint allows after T (read from single-byte tokens of a fresh state)."""
    table = compiled.vocab.token_bytes
    byte_token = {table[i][0]: i for i in range(len(table)) if table[i] and len(table[i]) == 1}
    eos = TOKENIZER.eos_token_id
    cache: dict[bytes, int] = {}

    def next_choice(text: bytes) -> int:  # a byte value, or 256 for EOS
        if text not in cache:
            state = ConstraintState(compiled)
            for b in text:
                state.advance(byte_token[b])
            row = compiled.mask(state.token_state)
            options = [b for b, t in byte_token.items() if row[t]] + ([256] if row[eos] else [])
            cache[text] = max(options, key=lambda c: _preference(text, c))
        return cache[text]

    def pick(text: bytes, allowed: torch.Tensor) -> int:
        path, choice = b"", next_choice(text)
        if choice == 256:
            return eos
        best = byte_token[choice]
        while choice != 256 and len(path) < 16:
            path += bytes([choice])
            for tid in allowed.nonzero().view(-1).tolist():
                if table[tid] == path:
                    best = tid
            choice = next_choice(text + path)
        return best

    return pick


def _text(compiled, ids) -> str:
    return b"".join(compiled.vocab.token_bytes[t] for t in ids).decode("utf-8")


@PROPERTY_SETTINGS
@given(regex=REGEXES, seed=st.integers(0, 2**16))
def test_random_regex_outputs_match(regex, seed):
    compiled = COMPILER.compile(regex=regex)
    for jump in (False, True):
        ids, finished, _ = run_decode(compiled, random_model(seed), jump)
        if finished:
            assert re.fullmatch(regex, _text(compiled, ids)), (regex, _text(compiled, ids), jump)


@PROPERTY_SETTINGS
@given(schema=schemas(), seed=st.integers(0, 2**16))
def test_random_schema_outputs_validate(schema, seed):
    compiled = COMPILER.compile(json_schema=schema)
    for jump in (False, True):
        ids, finished, _ = run_decode(compiled, random_model(seed), jump)
        if finished:
            jsonschema.validate(json.loads(_text(compiled, ids)), schema)


@PROPERTY_SETTINGS
@given(regex=REGEXES)
def test_greedy_regex_same_text_with_and_without_jump(regex):
    compiled = COMPILER.compile(regex=regex)
    off, done_off, _ = run_decode(compiled, greedy_text_model(compiled), jump=False)
    on, done_on, _ = run_decode(compiled, greedy_text_model(compiled), jump=True)
    assert done_off and done_on
    assert _text(compiled, on) == _text(compiled, off)
    assert re.fullmatch(regex, _text(compiled, on))


@PROPERTY_SETTINGS
@given(schema=schemas())
def test_greedy_schema_same_text_with_and_without_jump(schema):
    compiled = COMPILER.compile(json_schema=schema)
    off, done_off, _ = run_decode(compiled, greedy_text_model(compiled), jump=False)
    on, done_on, _ = run_decode(compiled, greedy_text_model(compiled), jump=True)
    assert done_off and done_on
    assert _text(compiled, on) == _text(compiled, off)
    jsonschema.validate(json.loads(_text(compiled, on)), schema)
    assert len(on) <= len(off) + 4  # retokenised, not longer in any meaningful way


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}}, "required": ["ok", "n"]},
])
def test_jump_forward_happens_in_schema_runs(schema):
    """On its own (any test order): each object opens with a forced `{"key": `, so jumps happen."""
    compiled = COMPILER.compile(json_schema=schema)
    _, done, jumps = run_decode(compiled, greedy_text_model(compiled), jump=True)
    assert done and jumps >= 1
