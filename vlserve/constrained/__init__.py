"""Constrained decoding: regex / JSON-schema token masks and jump-forward over a compressed FSM.

Per decode step, for a request with a ConstraintState `st` (see README.md):
    apply_constraint_masks(logits, states) → sample → st.advance(token) → st.is_terminated()?
    → jump = st.try_jump_forward(output_ids) → if jump: output_ids[jump.keep_len:] is replaced by
    jump.new_output_ids[jump.keep_len:], whose KV is computed in one extend pass.
"""

from vlserve.constrained.compiler import CompiledConstraint, ConstraintCompiler
from vlserve.constrained.errors import ConstraintError
from vlserve.constrained.jump_forward import JumpForward
from vlserve.constrained.masks import apply_constraint_masks
from vlserve.constrained.state import ConstraintState

__all__ = [
    "CompiledConstraint",
    "ConstraintCompiler",
    "ConstraintError",
    "ConstraintState",
    "JumpForward",
    "apply_constraint_masks",
]
