"""ConstraintState at its edges: after EOS nothing is allowed and nothing may follow, and ids the
byte table cannot spell (special tokens, ids past the tokenizer) are refused with ValueError, never
an IndexError or TypeError (survivors of benchmarks/results/mutation_constraint_state_fast.md)."""

from __future__ import annotations

import pytest
import torch
from helpers.constrained_helpers import train_tokenizer

from vlserve.constrained import ConstraintCompiler, ConstraintState


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


@pytest.fixture(scope="module")
def compiled(tok):
    return ConstraintCompiler(tok).compile(regex="(yes|no)")


def finished_state(tok, compiled) -> ConstraintState:
    state = ConstraintState(compiled)
    for t in tok.encode("yes", add_special_tokens=False):
        state.advance(t)
    state.advance(tok.eos_token_id)
    return state


def test_after_eos_the_mask_allows_nothing_even_padded_rows(tok, compiled):
    state = finished_state(tok, compiled)
    row = torch.ones(compiled.vocab.size + 8, dtype=torch.bool)  # padded embedding rows too
    state.fill_allowed_mask(row)
    assert not bool(row.any())
    assert state.is_terminated()


def test_a_token_after_eos_is_refused_with_its_reason(tok, compiled):
    state = finished_state(tok, compiled)
    with pytest.raises(ValueError, match=r"^constraint already finished: EOS was accepted$"):
        state.advance(tok.encode("y", add_special_tokens=False)[0])
    assert state.num_tokens == len(tok.encode("yes", add_special_tokens=False))


@pytest.mark.parametrize("past", [0, 1, 7])
def test_ids_past_the_tokenizer_are_refused(tok, compiled, past):
    state = ConstraintState(compiled)
    with pytest.raises(ValueError, match="not allowed"):
        state.advance(compiled.vocab.size + past)  # padded embedding rows: no bytes, no state
    assert state.num_tokens == 0 and state.token_state == compiled.initial_state


def test_a_special_token_other_than_eos_is_refused(tok, compiled):
    state = ConstraintState(compiled)
    assert compiled.vocab.token_bytes[tok.bos_token_id] is None  # it spells no bytes
    with pytest.raises(ValueError, match="not allowed"):
        state.advance(tok.bos_token_id)
    assert state.num_tokens == 0
    with pytest.raises(ValueError, match="not allowed"):
        state.replace_tail(0, [tok.bos_token_id])
    assert state.num_tokens == 0


# ---- replace_tail is all-or-nothing (survivors of the mutation run on vlserve/constrained/:
# benchmarks/results/mutation_constrained.md) ---------------------------------------------------


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
