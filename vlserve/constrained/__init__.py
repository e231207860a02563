"""Constrained decoding: regex / JSON-schema token masks and jump-forward over a compressed FSM.

Per decode step, for a request with a ConstraintState `st` (see README.md):
    apply_constraint_masks(logits, states) → sample → st.advance(token) → st.is_terminated()?
    → jump = propose_jump(st, output_ids) → the caller applies it once: output_ids[jump.keep_len:]
    becomes jump.new_output_ids[jump.keep_len:] (st.replace_tail), computed in one extend pass.
"""

from vlserve.constrained.compiler import CompiledConstraint, ConstraintCompiler
from vlserve.constrained.jump_forward import JumpForward, propose_jump
from vlserve.constrained.masks import apply_constraint_masks
from vlserve.constrained.state import ConstraintState
from vlserve.core.errors import ConstraintError  # re-exported: the error this package raises

__all__ = [
    "CompiledConstraint",
    "ConstraintCompiler",
    "ConstraintError",
    "ConstraintState",
    "JumpForward",
    "apply_constraint_masks",
    "propose_jump",
]
