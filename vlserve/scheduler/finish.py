"""When a request stops: EOS, stop token ids, stop strings, length, the context, its constraint."""

from vlserve.core.request import Req


class FinishChecker:
    def __init__(self, tokenizer, eos_token_ids: tuple[int, ...]):
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)

    def check(self, req: Req, context_len: int) -> str | None:
        tok = req.output_ids[-1]
        p = req.sampling
        if (tok in self.eos_token_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            return "stop"
        if req.constraint is not None and req.constraint.is_terminated():
            return "stop"
        if p.stop and self._hits_stop_string(req):
            return "stop"
        if len(req.output_ids) >= p.max_new_tokens or req.seq_len >= context_len:
            return "length"
        return None

    def _hits_stop_string(self, req: Req) -> bool:
        # A stop string can straddle tokens: decode a tail long enough to hold the longest one.
        tail = max(len(s) for s in req.sampling.stop) + 2
        text = self.tokenizer.decode(req.output_ids[-tail:], skip_special_tokens=False)
        return any(s in text for s in req.sampling.stop)
