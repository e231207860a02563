"""Masks, compressed edges, jump-forward retokenisation and errors, on hand-made constraints."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from helpers.constrained_helpers import apply_jump, decode_bytes, train_tokenizer, walked

from vlserve.constrained import ConstraintCompiler, ConstraintError, ConstraintState, apply_constraint_masks
from vlserve.constrained.vocab import token_bytes_table


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


@pytest.fixture(scope="module")
def compiler(tok):
    return ConstraintCompiler(tok)


@pytest.fixture(scope="module")
def table(tok):
    return token_bytes_table(tok)


def allowed_set(state, n):
    row = torch.zeros(n, dtype=torch.bool)
    state.fill_allowed_mask(row)
    return set(row.nonzero().view(-1).tolist())


def expected_set(language: list[bytes], text: bytes, table, eos: int) -> set[int]:
    prefixes = {w[:i] for w in language for i in range(len(w) + 1)}
    ok = {t for t, b in enumerate(table) if b and text + b in prefixes}
    return ok | ({eos} if text in language else set())


@pytest.mark.parametrize(
    "regex,language",
    [
        ("(yes|no)", [b"yes", b"no"]),
        (r"[0-9]{2,3}", ["".join(p).encode() for k in (2, 3) for p in itertools.product("0123456789", repeat=k)]),
        ("[ab]{1,3}c", ["".join(p).encode() + b"c" for k in (1, 2, 3) for p in itertools.product("ab", repeat=k)]),
        ("é(ü|x)", ["éü".encode(), "éx".encode()]),
        # optional tails after an accepting state (outlines-core alone drops them)
        ("x(ab)?", [b"x", b"xab"]),
        ("(00){0,1}", [b"", b"00"]),
        (r"1(\.5)?(e7)?", [b"1", b"1.5", b"1e7", b"1.5e7"]),
    ],
)
def test_regex_mask_is_exactly_the_viable_tokens(compiler, tok, table, regex, language):
    compiled = compiler.compile(regex=regex)
    eos = tok.eos_token_id
    for word in language[:40]:  # walk each word byte by byte, checking the mask at every step
        state = ConstraintState(compiled)
        ids = tok.encode(word.decode(), add_special_tokens=False)
        text = b""
        for tid in ids:
            assert allowed_set(state, len(tok)) == expected_set(language, text, table, eos)
            state.advance(tid)
            text += table[tid]
        assert allowed_set(state, len(tok)) == expected_set(language, text, table, eos)
        assert state.is_terminated() == (not any(w.startswith(text) and w != text for w in language))
        state.advance(eos)
        assert state.is_terminated()


def test_disallowed_token_and_early_eos_raise(compiler, tok):
    state = ConstraintState(compiler.compile(regex="(yes|no)"))
    with pytest.raises(ValueError, match="not allowed"):
        state.advance(tok.encode("x", add_special_tokens=False)[0])
    with pytest.raises(ValueError, match="EOS"):
        state.advance(tok.eos_token_id)


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_json_schema_jumps_over_long_constant_keys(compiler, tok, table):
    compiled = compiler.compile(json_schema=PERSON)
    state = ConstraintState(compiled)
    jf = apply_jump(state, [])
    assert jf is not None and jf.keep_len == 0
    assert jf.jumped_text == '{"name": "'
    assert decode_bytes(tok, jf.new_output_ids) == b'{"name": "'
    assert walked(compiled, jf.new_output_ids).token_states == state.token_states
    out = list(jf.new_output_ids)
    for tid in tok.encode('Bob"', add_special_tokens=False):
        state.advance(tid)
        out.append(tid)
    jf = apply_jump(state, out)
    # `, "age": ` or, when a space token can grow into ` 3`, ` 42`…, the stable `, "age":`
    assert jf is not None and jf.jumped_text in (', "age": ', ', "age":')
    assert decode_bytes(tok, jf.new_output_ids) == b'{"name": "Bob"' + jf.jumped_text.encode()
    assert apply_jump(state, jf.new_output_ids) is None  # the integer is the model's choice


def test_jump_retokenises_across_the_junction(compiler, tok, table):
    """The model wrote `{"na` one byte at a time; the jump re-encodes `{"name": "` as a whole."""
    compiled = compiler.compile(json_schema=PERSON)
    state = ConstraintState(compiled)
    byte_ids = [table.index(bytes([b])) for b in b'{"na']
    for tid in byte_ids:
        state.advance(tid)
    jf = apply_jump(state, byte_ids)
    assert jf is not None
    assert decode_bytes(tok, jf.new_output_ids) == b'{"name": "'
    assert jf.new_output_ids == tok.encode('{"name": "', add_special_tokens=False)
    assert jf.keep_len < len(byte_ids)  # token boundaries moved
    assert jf.jumped_text == 'me": "'
    fresh = walked(compiled, jf.new_output_ids)
    assert fresh.token_states == state.token_states and fresh.byte_states == state.byte_states
    assert allowed_set(fresh, len(tok)) == allowed_set(state, len(tok))


def _extendable_pair(tok, table):
    """A token t (≥ 2 letters, encodes as itself) and a longer token t+x (x letters)."""
    by_bytes = {b: i for i, b in enumerate(table) if b}
    for b, _ in sorted(by_bytes.items(), key=lambda kv: len(kv[0])):
        if len(b) >= 2 and b.isalpha() and tok.encode(b.decode(), add_special_tokens=False) == [by_bytes[b]]:
            for longer in by_bytes:
                if longer.startswith(b) and len(longer) > len(b) and longer.isalpha():
                    return b.decode(), longer[len(b):].decode()
    pytest.fail("the trained vocabulary has no extendable letter token: change the corpus")


def test_jump_stops_before_a_token_the_model_could_extend(compiler, tok, table):
    t, x = _extendable_pair(tok, table)
    import re

    extendable = ConstraintState(compiler.compile(regex=re.escape(t) + f"({re.escape(x)}|7)"))
    assert apply_jump(extendable, []) is None  # `t` could still grow into `t+x`
    closed = ConstraintState(compiler.compile(regex=re.escape(t) + "(7|8)"))
    jf = apply_jump(closed, [])
    assert jf is not None and jf.jumped_text == t


def test_jump_never_splits_a_utf8_character(compiler, tok):
    state = ConstraintState(compiler.compile(regex="東京 😀 (a|b)"))
    jf = apply_jump(state, [])
    assert jf is not None
    assert "東京 😀 ".startswith(jf.jumped_text)
    assert decode_bytes(tok, jf.new_output_ids) == jf.jumped_text.encode()


def test_no_jump_in_an_accepting_state(compiler):
    state = ConstraintState(compiler.compile(regex="ab(cdef)?"))
    jf = apply_jump(state, [])
    assert jf is None or jf.jumped_text == "ab"
    assert apply_jump(state, jf.new_output_ids if jf else []) is None  # after "ab": EOS or "cdef"


def test_batched_masks(compiler, tok):
    a = ConstraintState(compiler.compile(regex="(yes|no)"))
    b = ConstraintState(compiler.compile(regex="[0-9]+"))
    padded = len(tok) + 7  # model embedding rows past the tokenizer
    logits = torch.randn(3, padded)
    before = logits.clone()
    apply_constraint_masks(logits, [a, None, b])
    assert torch.equal(logits[1], before[1])
    for row, state in ((0, a), (2, b)):
        allowed = allowed_set(state, padded)
        finite = set((logits[row] > float("-inf")).nonzero().view(-1).tolist())
        assert finite == allowed and max(allowed) < len(tok)
        assert torch.equal(logits[row][sorted(allowed)], before[row][sorted(allowed)])


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"regex": "a(b"}, "invalid regex"),
        ({"regex": "[z-a]"}, "invalid regex"),
        ({"regex": "(?=a)a"}, "regex"),
        ({"regex": r"[^\x00-\x{10FFFF}]"}, "unsatisfiable"),
        ({"regex": r"a[^\x00-\x{10FFFF}]"}, "unsatisfiable"),
        ({"json_schema": "{not json"}, "not valid JSON"),
        ({"json_schema": {"type": "foo"}}, "invalid JSON schema"),
        ({"json_schema": {"type": "object", "properties": {"x": {"type": 3}}}}, "properties/x"),
        ({"json_schema": {"enum": []}}, "empty enum"),
        ({"json_schema": {"type": "string", "minLength": 5, "maxLength": 2}}, "minLength"),
        ({"json_schema": {"type": "integer", "minimum": 3}}, "minimum"),
        ({"json_schema": {"type": "object", "properties": {}, "required": ["a"]}}, "requires 'a'"),
        ({"json_schema": {"type": "string", "format": "weird"}}, "weird"),
        ({}, "exactly one"),
        ({"regex": "a", "json_schema": {}}, "exactly one"),
    ],
)
def test_bad_constraints_get_a_named_error(compiler, kwargs, fragment):
    with pytest.raises(ConstraintError, match=fragment.replace("(", r"\(")):
        compiler.compile(**kwargs)


def test_compile_is_cached(compiler):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    first = compiler.compile(json_schema=schema)
    assert compiler.compile(json_schema=json.dumps(schema)) is first
    email = compiler.compile(regex="[a-z]{2,4}@example\\.com")
    assert email is compiler.compile(regex="[a-z]{2,4}@example\\.com")
    assert apply_jump(ConstraintState(email), []) is None
    for _ in range(2):  # the error is cached too, and raised again
        with pytest.raises(ConstraintError):
            compiler.compile(regex="a(b")
