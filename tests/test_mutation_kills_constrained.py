"""Constraint state and jump-forward at their edges: replace_tail is all-or-nothing, and the
retokenised window never starts inside a UTF-8 character (survivors of the mutation run on
vlserve/constrained/: benchmarks/results/mutation_constrained.md)."""

from __future__ import annotations

import pytest
from helpers.constrained_helpers import train_tokenizer

from vlserve.constrained import ConstraintCompiler, ConstraintState
from vlserve.constrained.jump_forward import (RETOKENIZE_WINDOW, _complete_utf8_prefix, _encode_exact, _spells,
                                             _window_start)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_replace_tail_with_a_disallowed_id_changes_nothing(tok):
    state = ConstraintState(ConstraintCompiler(tok).compile(regex="(yes|no)[0-9]{3}"))
    for t in ids_of(tok, "yes1"):
        state.advance(t)
    before = (list(state.token_states), list(state.byte_states), state.num_tokens)
    bad = ids_of(tok, "x")
    with pytest.raises(ValueError, match="not allowed"):
        state.replace_tail(1, ids_of(tok, "2") + bad)
    assert (state.token_states, state.byte_states, state.num_tokens) == before
    state.advance(ids_of(tok, "2")[0])  # the state still walks on from where it was
    assert state.num_tokens == before[2] + 1


LEAD, CONT = b"\xe4", b"\x80"  # a 3-byte character's lead byte, a continuation byte


@pytest.mark.parametrize("back, tokens, start", [
    # `back`: the window would start at this index; `tokens`: bytes of the tokens there (index: bytes),
    # every other token is ASCII; `start`: where it must start instead
    (1, {0: LEAD, 1: CONT}, 0),  # 0x80 continues the character before it: back to its lead
    (1, {0: LEAD, 1: b"\xbf"}, 0),  # 0xBF, the last continuation byte
    (1, {0: LEAD, 1: b"\xc0"}, 1),  # 0xC0 is no continuation byte
    (1, {}, 1),
    (3, {2: LEAD, 3: CONT}, 2),  # one step back, not to the start
    (4, {2: LEAD, 3: CONT, 4: CONT}, 2),  # two steps back over continuations, never past the lead
])
def test_the_retokenised_window_starts_on_a_character_boundary(back, tokens, start):
    n = RETOKENIZE_WINDOW + back
    token_bytes = [tokens.get(i, b"a") for i in range(n)]  # token id i spells token_bytes[i]
    assert _window_start(list(range(n)), token_bytes) == start


@pytest.mark.parametrize("data, prefix", [
    ("aé".encode(), "aé".encode()),
    ("a😀".encode()[:-1], b"a"),  # an incomplete 4-byte character: its 3 bytes are dropped
    ("a😀".encode()[:-3], b"a"),
    (b"ab\x80\x80\x80\x80", None),  # 4 stray bytes are no incomplete character: nothing is valid
])
def test_at_most_an_incomplete_last_character_is_cut(data, prefix):
    assert _complete_utf8_prefix(data) == prefix


BYTES = [bytes([i]) for i in range(256)] + [None, b"\n{"]  # id i < 256 spells byte i; 256 is BOS; 257 "\n{"
BOS = 256


class BosAddingTokenizer:
    """Bytes as ids; adds BOS unless add_special_tokens=False (as Llama's does); "\n{" is one token."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        data, ids, i = text.encode(), [], 0
        while i < len(data):
            merged = data[i:i + 2] == b"\n{"
            ids.append(257 if merged else data[i])
            i += 2 if merged else 1
        return ([BOS] if add_special_tokens else []) + ids


def test_spells_needs_every_id_known_and_the_exact_bytes():
    assert _spells([104, 105], BYTES, b"hi")
    assert not _spells([104, 106], BYTES, b"hi")
    assert not _spells([BOS, 104, 105], BYTES, b"hi")  # a special token spells nothing
    assert not _spells([104, len(BYTES)], BYTES, b"h")  # ids past the table
    assert not _spells([104, len(BYTES) + 5], BYTES, b"h")


def test_retokenisation_encodes_without_special_tokens():
    # with BOS added the ids would not spell the text, and the newline anchor cannot help here
    assert _encode_exact(BosAddingTokenizer(), BYTES, b'{"a"') == list(b'{"a"')
