"""The batched sampler: greedy rows, filtered sampling rows, and the logprobs it reports.

Bugs caught (found by scripts/mutation.sh on vlserve/sampling/sampler.py, which had no direct test):
top-k/top-p/min-p keeping one token too many or too few at the boundary, temperature not applied or
applied to the reported logprob, a filtered distribution scattered back to the wrong vocabulary
positions, one row's parameters applied to another, logprobs of the wrong token.
"""

import math

import pytest
import torch

from vlserve.core.errors import InvalidRequest
from vlserve.core.sampling_params import SamplingParams
from vlserve.sampling.sampler import _filtered_probs, sample

PROBS = [0.1, 0.5, 0.15, 0.25]  # unsorted on purpose: the filter sorts and must scatter back
LOGITS = torch.log(torch.tensor([PROBS]))


def _filtered(**params) -> list[float]:
    return _filtered_probs(LOGITS.clone(), [SamplingParams(**params)])[0].tolist()


def _close(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, abs_tol=1e-6) for x, y in zip(a, b, strict=True))


def test_no_filter_is_the_softmax():
    assert _close(_filtered(), PROBS)


def test_top_k_keeps_exactly_k_highest():
    assert _close(_filtered(top_k=1), [0, 1.0, 0, 0])  # the filter alone (sample() takes top_k=1 as greedy)
    assert _close(_filtered(top_k=2), [0, 0.5 / 0.75, 0, 0.25 / 0.75])
    assert _close(_filtered(top_k=3), [0, 0.5 / 0.9, 0.15 / 0.9, 0.25 / 0.9])


def test_top_p_keeps_tokens_whose_preceding_mass_is_at_most_p():
    # sorted: 0.5, 0.25, 0.15, 0.1; mass before each: 0, 0.5, 0.75, 0.9
    assert _close(_filtered(top_p=0.5), [0, 0.5 / 0.75, 0, 0.25 / 0.75])
    assert _close(_filtered(top_p=0.4), [0, 1.0, 0, 0])
    assert _close(_filtered(top_p=0.8), [0, 0.5 / 0.9, 0.15 / 0.9, 0.25 / 0.9])


def test_min_p_drops_tokens_below_min_p_times_the_top_probability():
    # threshold 0.3 * 0.5 = 0.15: 0.15 stays (not strictly below), 0.1 goes
    assert _close(_filtered(min_p=0.3), [0, 0.5 / 0.9, 0.15 / 0.9, 0.25 / 0.9])
    assert _close(_filtered(min_p=0.6), [0, 1.0, 0, 0])


def test_temperature_sharpens_before_filtering():
    squared = [p * p for p in PROBS]
    assert _close(_filtered(temperature=0.5), [p / sum(squared) for p in squared])
    # at T=0.5 the mass is 0.676, 0.169, ...: top_p=0.6 now keeps only the first token
    assert _close(_filtered(temperature=0.5, top_p=0.6), [0, 1.0, 0, 0])


def test_each_row_uses_its_own_parameters():
    logits = LOGITS.repeat(3, 1)
    rows = _filtered_probs(logits, [SamplingParams(top_k=2), SamplingParams(), SamplingParams(min_p=0.6)]).tolist()
    assert _close(rows[0], [0, 0.5 / 0.75, 0, 0.25 / 0.75])
    assert _close(rows[1], PROBS)
    assert _close(rows[2], [0, 1.0, 0, 0])


def test_greedy_rows_take_the_argmax_with_its_unscaled_logprob():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    ids, logprobs = sample(logits, [SamplingParams(temperature=0), SamplingParams(top_k=1, temperature=5.0)],
                           [None, None])
    assert ids.tolist() == [1, 0]
    expected = torch.log_softmax(logits, dim=-1)[[0, 1], [1, 0]]
    assert torch.allclose(logprobs, expected)


def test_sampled_rows_follow_the_filtered_distribution_and_report_unfiltered_logprobs():
    """A sampled row beside a greedy one: draws stay inside top-k, hit both kept tokens, and the
    reported logprob is the token's under the raw logits (not after temperature or the filter)."""
    logits = torch.log(torch.tensor([PROBS, PROBS]))
    params = [SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=0)]
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(200):
        ids, logprobs = sample(logits.clone(), params, [gen, None])
        seen.add(int(ids[0]))
        assert int(ids[1]) == 1
        assert math.isclose(float(logprobs[0]), math.log(PROBS[int(ids[0])]), rel_tol=1e-5)
        assert math.isclose(float(logprobs[1]), math.log(0.5), rel_tol=1e-5)
    assert seen == {1, 3}


def test_same_seed_same_tokens():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=1.0)] * 4

    def draw(seed):
        gens = [torch.Generator().manual_seed(seed + i) for i in range(4)]
        return [sample(logits, params, gens)[0].tolist() for _ in range(5)]

    assert draw(7) == draw(7) and draw(7) != draw(8)


MASKED = torch.tensor([[1.0, float("-inf"), 3.0, float("-inf"), 2.0]])


@pytest.mark.parametrize("temperature", [3e38, 1e39, float("inf")])
def test_a_temperature_past_float32_is_near_uniform_over_the_unmasked_tokens(temperature):
    """Issue 51: 1e39 became inf in float32, -inf / inf = NaN on each masked token, and multinomial
    failed. Validation refuses 1e39 at the door; the sampler still never produces NaN from it."""
    probs = _filtered_probs(MASKED.clone(), [SamplingParams(temperature=temperature)])[0]
    assert probs[1] == 0 and probs[3] == 0
    assert _close([probs[0].item(), probs[2].item(), probs[4].item()], [1 / 3] * 3)
    ids, logprobs = sample(MASKED.clone(), [SamplingParams(temperature=temperature)],
                           [torch.Generator().manual_seed(0)])
    assert ids.item() in (0, 2, 4) and math.isfinite(logprobs.item())


def test_positive_infinite_logits_are_held_finite():
    """A float32-normal repetition_penalty divides a positive logit past float32's range."""
    logits = torch.tensor([[float("inf"), float("inf"), 0.0, float("-inf")]])
    probs = _filtered_probs(logits.clone(), [SamplingParams()])[0].tolist()
    assert _close(probs, [0.5, 0.5, 0.0, 0.0])
    ids, logprobs = sample(logits.clone(), [SamplingParams()], [None])
    assert ids.item() in (0, 1) and math.isfinite(logprobs.item())


def test_a_row_with_every_token_masked_is_the_requests_error():
    logits = torch.full((1, 4), float("-inf"))
    for params in (SamplingParams(), SamplingParams(temperature=0)):
        with pytest.raises(InvalidRequest, match="no token can be sampled"):
            sample(logits.clone(), [params], [None])


def test_one_dead_row_in_a_batch_is_found():
    """Bug caught: checking the batch as a whole (all tokens of all rows masked) let one dead row
    beside a live one through to the softmax."""
    logits = torch.tensor([[0.0, 1.0, float("-inf")], [float("-inf")] * 3])
    with pytest.raises(InvalidRequest, match="no token can be sampled.*exclude every token"):
        sample(logits, [SamplingParams(), SamplingParams()], [None, None])


def test_nan_logits_are_an_internal_error_not_the_requests():
    with pytest.raises(RuntimeError, match="^the model produced NaN logits$"):
        sample(torch.tensor([[float("nan"), 0.0]]), [SamplingParams()], [None])
