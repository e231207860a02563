"""Per-request constraint state: where the request's output stands in the token automaton and
in the byte-level compressed FSM, with the history needed to rebuild after retokenisation."""

from __future__ import annotations

import torch

from vlserve.constrained.compiler import CompiledConstraint


class ConstraintState:
    def __init__(self, compiled: CompiledConstraint):
        self.compiled = compiled
        self.output_ids: list[int] = []
        # token_states[i] / byte_states[i]: automaton states after the first i output tokens.
        self.token_states: list[int] = [compiled.initial_state]
        self.byte_states: list[int] = [compiled.byte_dfa.initial]
        self.eos_accepted = False

    @property
    def token_state(self) -> int:
        return self.token_states[-1]

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
        self.output_ids.append(token_id)
        self.token_states.append(nxt)
        self.byte_states.append(byte_state)

    def is_terminated(self) -> bool:
        """EOS was accepted, or the constraint is complete and allows nothing but EOS (the engine
        may finish the request without sampling that EOS)."""
        return self.eos_accepted or self.compiled.only_eos_left(self.token_state)

    def truncate(self, length: int) -> None:
        """Forget every output token from index `length` on."""
        del self.output_ids[length:]
        del self.token_states[length + 1 :]
        del self.byte_states[length + 1 :]

    def replace_tail(self, keep_len: int, new_ids: list[int]) -> None:
        """Rebuild the states for output = output_ids[:keep_len] + new_ids, walking only the new
        ids. All-or-nothing: on a disallowed id the old output is restored and ValueError raised."""
        old = self.output_ids[keep_len:]
        self.truncate(keep_len)
        try:
            for tid in new_ids:
                self._push(tid)
        except ValueError:
            self.truncate(keep_len)
            for tid in old:
                self._push(tid)
            raise

    def try_jump_forward(self, output_ids: list[int]):
        """See vlserve.constrained.jump_forward.jump_forward."""
        from vlserve.constrained.jump_forward import jump_forward

        if output_ids != self.output_ids:
            raise ValueError(
                "output_ids differ from the tokens this constraint state advanced through"
            )
        return jump_forward(self)
