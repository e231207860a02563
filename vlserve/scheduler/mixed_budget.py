"""How many prefill tokens a step may carry while other requests decode (`--mixed-prefill-ratio`).

Every decode batched into a step waits for the whole step: a 2,048-token prefill chunk makes each
running stream's next token about 2 s late on a CPU. So while requests decode, a step's prefill
(chunk continuations and admissions, with the tower work their images start) is sized to take about
`ratio` decode steps: ratio x (a decode step's seconds) / (a prefill token's seconds), within
[MIN_TOKENS, --chunked-prefill-size]. Both costs are moving averages over the engine's own steps
(the scheduler times each plan until its result comes back), so the budget follows the model, the
machine and its load, where a fixed token count (vLLM's max_num_batched_tokens, SGLang's
chunked_prefill_size) costs what it costs. Until a prefill has been timed, PROBE_TOKENS. With no
request decoding, a step gets all of --chunked-prefill-size: prompts alone prefill at full speed.
"""

from dataclasses import dataclass

MIN_TOKENS = 16  # every step still moves a prefill on, however slow a token is
PROBE_TOKENS = 256  # the first prefill beside decodes, before a token's cost is known
MIN_TIMED_TOKENS = 16  # smaller extends say too little about a token's cost
SMOOTHING = 0.25  # weight of the newest step in each moving average


@dataclass
class MixedStepBudget:
    ratio: float  # a mixed step's prefill time, in decode steps; 0: no cap beyond chunked_prefill_size
    ceiling: int  # --chunked-prefill-size
    decode_step_s: float | None = None
    prefill_token_s: float | None = None

    def tokens(self, decoding: bool) -> int:
        """The step's prefill token budget; `decoding`: some running request decodes this step."""
        if not decoding or self.ratio <= 0:
            return self.ceiling
        if self.decode_step_s is None or self.prefill_token_s is None:
            return min(self.ceiling, PROBE_TOKENS)
        fits = int(self.ratio * self.decode_step_s / max(self.prefill_token_s, 1e-9))
        return max(min(MIN_TOKENS, self.ceiling), min(fits, self.ceiling))

    def observe(self, seconds: float, decodes: int, prefill_tokens: int) -> None:
        """One step's wall time, its decodes (one token each) and its other extends' tokens."""
        if prefill_tokens == 0:
            if decodes:
                self.decode_step_s = _average(self.decode_step_s, seconds)
        elif prefill_tokens >= MIN_TIMED_TOKENS:
            beyond = max(seconds - (self.decode_step_s or 0.0 if decodes else 0.0), 0.0)
            self.prefill_token_s = _average(self.prefill_token_s, beyond / prefill_tokens)


def _average(current: float | None, sample: float) -> float:
    return sample if current is None else current + SMOOTHING * (sample - current)
