"""Jump-forward's helpers with exact answers: the newline anchor for tokenizers that prepend a
space, the stable-boundary cut, the common prefix (survivors of
benchmarks/results/mutation_jump_forward_fast.md)."""

from __future__ import annotations

import pytest
from helpers.constrained_helpers import train_tokenizer

from vlserve.constrained import ConstraintCompiler, ConstraintState
from vlserve.constrained.jump_forward import (RETOKENIZE_WINDOW, _common_prefix, _complete_utf8_prefix,
                                             _encode_exact, _spells, _stable_prefix, _window_start,
                                             propose_jump)

BYTES = [bytes([i]) for i in range(256)] + [None, b"\n{"]  # id i < 256 spells byte i; 256 is BOS; 257 "\n{"
BOS, UNKNOWN = 256, 999  # UNKNOWN: an id past the table, which spells nothing


class SpacePrependingTokenizer:
    """Bytes as ids, like a SentencePiece tokenizer: a space before every text, BOS unless
    add_special_tokens=False, and "~" encoded to an id the table does not know. Like a fast tokenizer
    it refuses a flag that is not a bool."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(add_special_tokens, bool):
            raise TypeError(f"{add_special_tokens!r} is not an instance of 'bool'")
        ids = [UNKNOWN if b == ord("~") else b for b in (" " + text).encode()]
        return ([BOS] if add_special_tokens else []) + ids


def test_the_newline_anchor_strips_the_prepended_space():
    # plain encoding spells " {..." (one byte too many); "\n" + text encodes as " \n{...": drop " \n"
    assert _encode_exact(SpacePrependingTokenizer(), BYTES, b'{"a"') == list(b'{"a"')


def test_the_anchor_must_leave_ids_that_spell_the_text():
    assert _encode_exact(SpacePrependingTokenizer(), BYTES, b"a~b") is None


@pytest.mark.parametrize("a, b, n", [([1, 2, 3], [1, 2, 4], 2), ([5, 6, 7], [5, 6, 7, 8], 3), ([], [1], 0),
                                     ([1], [2], 0)])
def test_common_prefix_counts_every_shared_id(a, b, n):
    assert _common_prefix(a, b) == n


@pytest.fixture(scope="module")
def compiled():
    return ConstraintCompiler(train_tokenizer()).compile(regex="abé")


def ids(compiled, *pieces: bytes) -> list[int]:
    table = compiled.vocab.token_bytes
    return [table.index(p) for p in pieces]  # the single-byte tokens of the byte-level vocabulary


@pytest.mark.parametrize("pieces, old_len, kept", [
    ((b"a", b"b"), 2, 0),  # the only boundary ends at the old text's end: nothing new to keep
    ((b"a", b"b"), 1, 2),
    ((b"a", b"b", b"\xc3"), 1, 2),  # the last token ends inside "é": step back past it, not stop
    ((b"a", b"b", b"\xc3", b"\xa9"), 1, 4),
    ((b"a", b"b", b"\xc3", b"\xa9"), 3, 4),  # the old text may end inside the character
    ((b"a", b"x"), 0, 0),  # an id the constraint refuses: no jump
    ((), 0, 0),  # nothing to keep (never an index from the end)
])
def test_stable_prefix_keeps_up_to_the_last_stable_boundary(compiled, pieces, old_len, kept):
    full = b"".join(pieces)
    assert _stable_prefix(compiled, compiled.initial_state, ids(compiled, *pieces), full, old_len) == kept


def test_output_ids_out_of_step_with_the_state_are_refused_with_both_counts(compiled):
    with pytest.raises(ValueError, match=r"^2 output ids, but the constraint state walked 0$"):
        propose_jump(ConstraintState(compiled), ids(compiled, b"a", b"b"))


# ---- the retokenised window never starts inside a UTF-8 character, and retokenisation encodes
# without special tokens (survivors of the mutation run on vlserve/constrained/:
# benchmarks/results/mutation_constrained.md) ---------------------------------------------------


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
