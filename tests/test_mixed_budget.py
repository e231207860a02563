"""The prefill budget of a step beside decodes (--mixed-prefill-ratio, issue 48): sized from the
steps' measured costs, so a long prompt does not stall the running streams; all of
--chunked-prefill-size when nothing decodes."""

from test_scheduler_lifecycle import scheduler, submit

from vlserve.core.forward_batch import ForwardMode
from vlserve.core.step import SampledToken, StepResult
from vlserve.scheduler.mixed_budget import MIN_TIMED_TOKENS, MIN_TOKENS, PROBE_TOKENS, SMOOTHING, MixedStepBudget


class StepClock:
    """A forward costs DECODE_S when it decodes, plus TOKEN_S per token of its longer extends."""
    DECODE_S, TOKEN_S = 1 / 16, 1 / 1024  # binary fractions: the sums and averages are exact

    def __init__(self):
        self.now, self.pending = 0.0, 0.0

    def __call__(self) -> float:
        self.now, self.pending = self.now + self.pending, 0.0  # the forward's cost lands before process()
        return self.now


def timed_step(s, clock: StepClock) -> dict[str, int]:
    """One schedule → a forward costing what StepClock says → process; the plan as {rid: tokens}."""
    plan = s.schedule()
    clock.pending = (clock.DECODE_S if any(p.num_tokens == 1 for p in plan) else 0.0) + \
        clock.TOKEN_S * sum(p.num_tokens for p in plan if p.num_tokens > 1)
    sampled = [SampledToken(7, -0.25) if p.sample else None for p in plan]
    s.process(StepResult(plan, ForwardMode.EXTEND, sampled, [None] * len(plan), [[] for _ in plan]))
    return {p.req.rid: p.num_tokens for p in plan}


def test_beside_decodes_a_long_prompt_is_prefilled_in_steps_sized_to_one_decode_step():
    clock = StepClock()
    s = scheduler(capacity=2048, context_len=1024, clock=clock, chunked_prefill_size=512, mixed_prefill_ratio=1.0)
    submit(s, "chat", 8, max_new_tokens=400)
    assert timed_step(s, clock) == {"chat": 8}  # nothing decodes yet: the whole budget
    for _ in range(3):
        timed_step(s, clock)  # decodes alone: a decode step's cost is measured
    submit(s, "long", 900, max_new_tokens=2, first_id=2000)
    chunks = [timed_step(s, clock) for _ in range(6)]
    assert all(c["chat"] == 1 for c in chunks)  # the stream decodes every step
    # the first chunk probes a token's cost; then 1 x 1/16 s / (1/1024 s per token) = 64 tokens a step
    assert [c["long"] for c in chunks] == [PROBE_TOKENS, 64, 64, 64, 64, 64]


def test_alone_a_prompt_gets_the_whole_chunk_and_ratio_zero_turns_it_off():
    budget = MixedStepBudget(ratio=1.0, ceiling=2048, decode_step_s=0.05, prefill_token_s=0.001)
    assert budget.tokens(decoding=False) == 2048 and budget.tokens(decoding=True) == 50
    budget.observe(0.06, decodes=2, prefill_tokens=0)  # a slower decode step: more room
    assert budget.decode_step_s > 0.05 and budget.tokens(decoding=True) > 50
    assert MixedStepBudget(0.0, 2048, 0.05, 0.001).tokens(decoding=True) == 2048
    assert MixedStepBudget(1.0, 2048, 0.001, 10.0).tokens(decoding=True) == MIN_TOKENS  # always some progress


def test_observe_keeps_moving_averages_of_a_decode_step_and_a_prefill_token():
    budget = MixedStepBudget(ratio=1.0, ceiling=2048)
    budget.observe(0.08, decodes=2, prefill_tokens=0)  # the first sample is the average
    assert budget.decode_step_s == 0.08
    budget.observe(0.16, decodes=2, prefill_tokens=0)
    assert budget.decode_step_s == 0.08 + SMOOTHING * (0.16 - 0.08)
    decode_s = budget.decode_step_s
    # a mixed step: its decodes' share is taken off before the prefill tokens are charged
    budget.observe(decode_s + 0.064, decodes=2, prefill_tokens=MIN_TIMED_TOKENS)
    assert abs(budget.prefill_token_s - 0.064 / MIN_TIMED_TOKENS) < 1e-12
    # a prefill alone is charged whole; the average moves by SMOOTHING towards it
    budget.observe(0.032, decodes=0, prefill_tokens=MIN_TIMED_TOKENS)
    expected = 0.004 + SMOOTHING * (0.032 / MIN_TIMED_TOKENS - 0.004)
    assert abs(budget.prefill_token_s - expected) < 1e-12
    budget.observe(10.0, decodes=0, prefill_tokens=MIN_TIMED_TOKENS - 1)  # too few tokens to time
    assert abs(budget.prefill_token_s - expected) < 1e-12
    assert budget.decode_step_s == decode_s  # prefill steps leave the decode cost alone


def test_without_a_measured_decode_step_a_mixed_step_charges_its_prefill_whole():
    budget = MixedStepBudget(ratio=1.0, ceiling=2048)
    budget.observe(0.032, decodes=3, prefill_tokens=2 * MIN_TIMED_TOKENS)
    assert abs(budget.prefill_token_s - 0.032 / (2 * MIN_TIMED_TOKENS)) < 1e-12
