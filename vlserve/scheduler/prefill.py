"""Admission of waiting requests into this step's prefill, under the token and memory budgets.

Requests are taken in policy order and admission stops at the first that does not fit, so the
policy's order (lpm = a DFS of the radix tree) is what the cache sees. Memory: an admitted request
needs slots for the tokens it prefills now plus a reserve for its decode (remaining new tokens ×
new_token_ratio); the running requests' reserves are held back the same way. Retraction is the
safety valve when the estimate is too low. In-batch sharing (round_sharing.py): a request sharing
an uncached prefix with one admitted before it borrows that one's slots, or waits a round.
"""

from vlserve.core.request import Req
from vlserve.core.step import PlannedExtend
from vlserve.memory.allocator import OutOfSlots
from vlserve.scheduler.cache_manager import CacheManager
from vlserve.scheduler.policy import SchedulePolicy
from vlserve.scheduler.round_sharing import RoundSharing
from vlserve.scheduler.vision_budget import VisionBudget


class PrefillAdmission:
    def __init__(self, cm: CacheManager, policy: SchedulePolicy, new_token_ratio: float,
                 max_running_requests: int, prefix_share_threshold: int):
        self.cm, self.policy = cm, policy
        self.new_token_ratio = new_token_ratio
        self.max_running_requests = max_running_requests
        self.prefix_share_threshold = prefix_share_threshold

    def reserve(self, req: Req) -> int:
        return int(req.remaining_new_tokens * self.new_token_ratio + 0.999)

    def admit(self, waiting: list[Req], running: list[Req], token_budget: int,
              vision: VisionBudget | None = None) -> list[PlannedExtend]:
        """The first extends of the waiting requests admitted now, in policy order, within the token
        budget and the step's vision budget. The caller moves them from its waiting queue to its
        running list."""
        vision = vision or VisionBudget(None)
        sharing = self._round_sharing(running)
        reserved = sum(self.reserve(r) for r in running)
        planned = []
        for req in self.policy.order(waiting):
            if token_budget <= 0 or len(running) + len(planned) >= self.max_running_requests:
                break
            lend = None
            if sharing is not None:
                cached = self.cm.cache.peek_prefix_len(req.seq)
                lend = sharing.lender(req, cached)
                if lend is None and sharing.must_wait(req, cached) and not self.policy.is_overdue(req):
                    continue  # hits this round's KV from the cache next round
            if not self.cm.admit(req):
                break
            if lend is not None and req.kv_len != cached:  # the hit was capped (its last token, logprobs)
                lend = sharing.lender(req, req.kv_len)
            if lend is not None:
                self.cm.borrow(req, lend.leader, lend.end)
            n = vision.cap(req, min(req.pending_len, token_budget))
            if n == 0:  # its next image waits for the next step's vision budget
                self.cm.release(req)
                break
            need = self.cm.allocator.slots_needed(req.kv_len, n)
            if n == req.pending_len:
                need += self.reserve(req)
            try:
                if need > self.cm.available_slots() - reserved:
                    raise OutOfSlots(f"need {need} slots")
                slots = self.cm.alloc(req, n)
            except OutOfSlots:
                self.cm.release(req)  # unlocks its prefix, drops what it borrowed, gives back its row
                break
            planned.append(PlannedExtend(req, n, slots))
            if sharing is not None:
                sharing.add(req, req.kv_len + n)
            token_budget -= n
            reserved += self.reserve(req)
        return planned

    def _round_sharing(self, running: list[Req]) -> RoundSharing | None:
        if self.cm.cache.disabled or self.prefix_share_threshold <= 0:
            return None
        in_flight = [r.seq for r in running if r.pending_len > 1]  # prompts in chunked prefill
        return RoundSharing(self.prefix_share_threshold, self.cm.page_size, in_flight)
