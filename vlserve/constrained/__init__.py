"""Constrained decoding: regex / JSON-schema token masks and jump-forward over a compressed FSM.

Per decode step, for a request with a ConstraintState `st` (see README.md):
    apply_constraint_masks(logits, states) → sample → st.advance(token) → st.is_terminated()?
    → jump = propose_jump(st, output_ids) → the caller applies it once: output_ids[jump.keep_len:]
    becomes jump.new_output_ids[jump.keep_len:] (st.replace_tail), computed in one extend pass.

The names below are imported on first use, so a compile worker process (compile_worker.py), which
needs only the regex → DFA half, starts without torch.
"""

from importlib import import_module

_EXPORTS = {
    "CompileBudget": "vlserve.constrained.compiler",
    "CompileWorkers": "vlserve.constrained.compile_workers",
    "CompiledConstraint": "vlserve.constrained.compiler",
    "ConstraintCompiler": "vlserve.constrained.compiler",
    "ConstraintError": "vlserve.core.errors",  # re-exported: the error this package raises
    "ConstraintState": "vlserve.constrained.state",
    "ConstraintTooLarge": "vlserve.constrained.byte_compile",
    "JumpForward": "vlserve.constrained.jump_forward",
    "apply_constraint_masks": "vlserve.constrained.masks",
    "propose_jump": "vlserve.constrained.jump_forward",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
