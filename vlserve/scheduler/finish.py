"""When a request stops: EOS, stop token ids, stop strings and regexes, length, the context, its constraint."""

import re

from vlserve.core.request import Req

STOP_REGEX_TAIL = 64  # output tokens a stop_regex is searched in (checked every step, so a match is seen as it forms)


class FinishChecker:
    def __init__(self, tokenizer, eos_token_ids: tuple[int, ...]):
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)

    def check(self, req: Req, context_len: int) -> tuple[str, int | str | None] | None:
        """(reason, what matched: the stop token id or stop string, else None), or None to go on."""
        tok = req.output_ids[-1]
        p = req.sampling
        early = len(req.output_ids) < p.min_new_tokens  # stops do not count yet (EOS was masked)
        if not early and ((tok in self.eos_token_ids and not p.ignore_eos) or tok in p.stop_token_ids):
            return "stop", tok
        if req.constraint is not None and req.constraint.is_terminated():
            return "stop", None
        matched = self._stop_string(req) if not early and p.stop else None
        if matched is None and not early and p.stop_regex:
            matched = self._stop_regex(req)
        if matched is not None:
            return "stop", matched
        if len(req.output_ids) >= p.max_new_tokens or req.seq_len >= context_len:
            return "length", None
        return None

    def _stop_string(self, req: Req) -> str | None:
        # A stop string can straddle tokens: decode a tail long enough to hold the longest one.
        tail = max(len(s) for s in req.sampling.stop) + 2
        text = self.tokenizer.decode(req.output_ids[-tail:], skip_special_tokens=False)
        return next((s for s in req.sampling.stop if s in text), None)

    def _stop_regex(self, req: Req) -> str | None:
        text = self.tokenizer.decode(req.output_ids[-STOP_REGEX_TAIL:], skip_special_tokens=False)
        return next((r for r in req.sampling.stop_regex if (m := re.search(r, text)) and m.end() > m.start()), None)
