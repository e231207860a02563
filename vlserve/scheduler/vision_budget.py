"""The vision budget of one step (--max-num-encoder-input-tokens, vLLM's name): the tower's work is
scheduled like prefill.

An extend that reaches an image or frame makes the runner encode it (runner/image_embedder.py: the
whole item, once; later chunks take its rows from the vision cache). So the tower's work in a step is
the vision tokens of the items whose first position falls in that step's extends. A step takes items
in plan order while they fit the budget; an extend is cut just before the first item that does not,
so a long video's frames are encoded over several steps, and the decodes batched with them (one
token each, no tower work) run every step meanwhile. An item larger than the whole budget is still
taken when it is the step's first, so every request makes progress.
"""

from dataclasses import dataclass

from vlserve.core.request import Req


@dataclass
class VisionBudget:
    limit: int | None  # vision tokens per step; None: no cap
    used: int = 0

    def cap(self, req: Req, num_tokens: int) -> int:
        """How many of the num_tokens positions from req.kv_len this step may extend (maybe 0), and
        charges the items they start to the budget."""
        if self.limit is None or not req.images:
            return num_tokens
        start, end = req.kv_len, req.kv_len + num_tokens
        for span in req.images:
            if not start <= span.start < end:
                continue  # started in an earlier step (encoded then), or beyond this extend
            if self.used + span.length > self.limit and self.used > 0:
                return span.start - start
            self.used += span.length
        return num_tokens
