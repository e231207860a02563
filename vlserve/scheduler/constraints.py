"""Constrained requests in the scheduler: jump-forward proposals checked and applied once.

After a constrained request samples a token, its compressed FSM may force a string (e.g. the
`", "age": ` between two JSON values). The constraint layer proposes the whole new output
(propose_jump: the last tokens retokenised with the forced text, so token boundaries are the
model's); this module decides and applies it once: KV of the rewritten tail is rewound, the
request's output ids and its constraint state are replaced, and the new tokens are computed in
one extend pass on the next step — never token by token. The radix cache keeps the retokenised ids.
A proposal that would rewrite tokens the radix tree already shares is declined (nothing changes).
"""

from vlserve.constrained import JumpForward, propose_jump
from vlserve.core.request import Req
from vlserve.scheduler.cache_manager import CacheManager

FORCED_LOGPROB = 0.0  # a jumped token had no choice


class ConstraintHooks:
    def __init__(self, cm: CacheManager, context_len: int, jump_forward: bool = True):
        self.cm, self.context_len, self.jump_forward = cm, context_len, jump_forward

    def first_jump(self, req: Req) -> JumpForward | None:
        """A schema's output often starts forced (`{"name": "`): the jump to make before sampling."""
        if not (self.jump_forward and req.constraint is not None and not req.output_ids):
            return None
        return propose_jump(req.constraint, [])

    def apply_first_jump(self, req: Req, jump: JumpForward) -> None:
        self._apply(req, jump)

    def after_token(self, req: Req, token: int) -> int | None:
        """Advances the FSM past the sampled token (already in req.output_ids); applies a jump if one
        is proposed and allowed. Returns the first output index the client has not seen in its
        current form (for the step's StepOutput.replace_from), or None."""
        if req.constraint is None:
            return None
        req.constraint.advance(token)
        if not self.jump_forward or req.constraint.is_terminated():
            return None
        jump = propose_jump(req.constraint, req.output_ids)
        if jump is None or len(req.input_ids) + jump.keep_len < req.tree_len:
            return None  # no jump, or the tail to rewrite is already shared in the tree: keep it
        sent = len(req.output_ids) - 1  # the token sampled this step was not sent yet
        self._apply(req, jump)
        return min(jump.keep_len, sent)

    def _apply(self, req: Req, jump: JumpForward) -> None:
        """The one place a jump changes anything: KV, output ids and logprobs, constraint state.
        The forced text is cut at max_new_tokens and at the context's end: a request never holds
        more tokens than it may compute (the finish check then ends it with "length")."""
        room = min(req.sampling.max_new_tokens, self.context_len - len(req.input_ids))
        new_ids = jump.new_output_ids[:max(room, jump.keep_len)]
        self.cm.rewind(req, min(req.kv_len, len(req.input_ids) + jump.keep_len))
        req.constraint.replace_tail(jump.keep_len, new_ids[jump.keep_len:])
        forced = len(new_ids) - jump.keep_len
        req.output_logprobs = req.output_logprobs[:jump.keep_len] + [FORCED_LOGPROB] * forced
        req.output_top_logprobs = req.output_top_logprobs[:jump.keep_len] + [[] for _ in range(forced)]
        req.output_ids = list(new_ids)
