"""Jump-forward's helpers with exact answers: the newline anchor for tokenizers that prepend a
space, the stable-boundary cut, the common prefix (survivors of
benchmarks/results/mutation_jump_forward_fast.md)."""

from __future__ import annotations

import pytest
from helpers.constrained_helpers import train_tokenizer

from vlserve.constrained import ConstraintCompiler, ConstraintState
from vlserve.constrained.jump_forward import _common_prefix, _encode_exact, _stable_prefix, propose_jump

BYTES = [bytes([i]) for i in range(256)] + [None]  # id i < 256 spells byte i; 256 is BOS
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
