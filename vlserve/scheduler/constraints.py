"""Constrained decoding in the scheduler: vocabulary masks, and jump-forward with retokenisation.

After a constrained request samples a token, its compressed FSM may force a string (e.g. the
`", "age": ` between two JSON values). Jump-forward appends it at once: the output is retokenised
(decode(output) + forced string, re-encoded, so token boundaries are the model's), KV of the
rewritten tail is dropped, and the new tokens are computed in one extend pass on the next step —
never token by token. The retokenised ids are what the radix cache keeps.
"""

from vlserve.constrained import apply_constraint_masks
from vlserve.engine.request import Req
from vlserve.scheduler.cache_manager import CacheManager

FORCED_LOGPROB = 0.0  # a jumped token had no choice


class ConstraintHooks:
    def __init__(self, jump_forward: bool = True):
        self.jump_forward = jump_forward

    def mask(self, logits, reqs: list[Req]) -> None:
        apply_constraint_masks(logits, [r.constraint for r in reqs])

    def jump_before_first_token(self, req: Req) -> bool:
        """A schema's output often starts forced (`{"name": "`): jump before sampling anything."""
        if not (self.jump_forward and req.constraint is not None and not req.output_ids):
            return False
        jump = req.constraint.try_jump_forward([])
        if jump is None:
            return False
        req.output_ids = list(jump.new_output_ids)
        req.output_logprobs = [FORCED_LOGPROB] * len(req.output_ids)
        return True

    def after_token(self, req: Req, token: int, cm: CacheManager) -> int | None:
        """Advances the FSM; on a jump rewrites the output tail. Returns the first output index the
        client has not seen in its current form (for the step's StepOutput.replace_from)."""
        if req.constraint is None:
            return None
        req.constraint.advance(token)
        if not self.jump_forward or req.constraint.is_terminated():
            return None
        old = list(req.output_ids)
        jump = req.constraint.try_jump_forward(old)
        if jump is None:
            return None
        new_kv_len = min(req.kv_len, len(req.input_ids) + jump.keep_len)
        if new_kv_len < req.tree_len:  # the tail to rewrite is already shared in the tree: keep it
            req.constraint.replace_tail(jump.keep_len, old[jump.keep_len:])
            return None
        cm.rewind(req, new_kv_len)
        req.output_ids = list(jump.new_output_ids)
        req.output_logprobs = req.output_logprobs[:jump.keep_len] + \
            [FORCED_LOGPROB] * (len(req.output_ids) - jump.keep_len)
        return min(jump.keep_len, len(old) - 1)  # the token sampled this step was not sent yet
