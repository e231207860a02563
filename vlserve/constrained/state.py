"""Per-request constraint state: where the request's output stands in the token automaton and
in the byte-level compressed FSM, with the history needed to rebuild after retokenisation.

The output ids themselves live in one place, the request (Req.output_ids); this state holds the
automaton states after every prefix of them, so `num_tokens` must always equal their count.
"""

from __future__ import annotations

import torch

from vlserve.constrained.compiler import CompiledConstraint


class ConstraintState:
    def __init__(self, compiled: CompiledConstraint):
        self.compiled = compiled
        # token_states[i] / byte_states[i]: automaton states after the first i output tokens.
        self.token_states: list[int] = [compiled.initial_state]
        self.byte_states: list[int] = [compiled.byte_dfa.initial]
        self.eos_accepted = False

    @property
    def token_state(self) -> int:
        return self.token_states[-1]

    @property
    def num_tokens(self) -> int:
        """Output tokens this state has walked (EOS not counted)."""
        return len(self.token_states) - 1

    def fill_allowed_mask(self, mask_row: torch.Tensor) -> None:
        """Write the allowed next tokens into a bool row (True = allowed). Ids past the
        tokenizer's length (padded embedding rows) are never allowed."""
        n = self.compiled.vocab.size
        if self.eos_accepted:
            mask_row.fill_(False)
            return
        mask_row[:n].copy_(self.compiled.mask(self.token_state))
        mask_row[n:] = False

    def advance(self, token_id: int) -> None:
        """Consume the sampled token. A token the mask did not allow is a caller bug: ValueError."""
        if self.eos_accepted:
            raise ValueError("constraint already finished: EOS was accepted")
        if token_id in self.compiled.vocab.eos_ids:
            if not self.compiled.is_accepting(self.token_state):
                raise ValueError(f"EOS {token_id} is not allowed before the constraint is complete")
            self.eos_accepted = True
            return
        self._push(token_id)

    def _push(self, token_id: int) -> None:
        nxt = self.compiled.next_state(self.token_state, token_id)
        data = self.compiled.vocab.token_bytes[token_id] if token_id < self.compiled.vocab.size else None
        byte_state = self.compiled.byte_dfa.step(self.byte_states[-1], data) if data else None
        if nxt is None or byte_state is None:
            raise ValueError(f"token {token_id} is not allowed by the constraint here")
        self.token_states.append(nxt)
        self.byte_states.append(byte_state)

    def is_terminated(self) -> bool:
        """EOS was accepted, or the constraint is complete and allows nothing but EOS (the engine
        may finish the request without sampling that EOS)."""
        return self.eos_accepted or self.compiled.only_eos_left(self.token_state)

    def truncate(self, length: int) -> None:
        """Forget every output token from index `length` on."""
        del self.token_states[length + 1 :]
        del self.byte_states[length + 1 :]

    def replace_tail(self, keep_len: int, new_ids: list[int]) -> None:
        """Rebuild the states for output = output[:keep_len] + new_ids, walking only the new ids.
        All-or-nothing: on a disallowed id the states are left as they were and ValueError raised."""
        saved = (list(self.token_states), list(self.byte_states))
        self.truncate(keep_len)
        try:
            for tid in new_ids:
                self._push(tid)
        except ValueError:
            self.token_states, self.byte_states = saved
            raise
