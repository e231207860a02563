"""Presence, frequency and repetition penalties and min_new_tokens, against a row-by-row reference
written from their definitions (vLLM's and SGLang's)."""

import math
import random

import torch

from vlserve.core.sampling_params import SamplingParams
from vlserve.sampling.penalties import apply_penalties, mask_early_stops


def reference(logits: list[float], p: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    out = list(logits)
    for t in range(len(out)):
        count = output.count(t)
        out[t] -= p.presence_penalty * (count > 0) + p.frequency_penalty * count
        if count or t in prompt:
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    return out


def test_batched_penalties_equal_the_reference():
    rng = random.Random(0)
    vocab, rows = 50, 6
    params = [SamplingParams(presence_penalty=rng.uniform(-2, 2), frequency_penalty=rng.uniform(-2, 2),
                             repetition_penalty=rng.uniform(0.5, 2)) for _ in range(rows - 1)] + [SamplingParams()]
    prompts = [[rng.randrange(vocab) for _ in range(8)] + [2**62 + 5] for _ in range(rows)]  # + an image key
    outputs = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 12))] for _ in range(rows)]
    logits = torch.randn(rows, vocab)
    expected = [reference(logits[i].tolist(), params[i], prompts[i], outputs[i]) for i in range(rows)]
    apply_penalties(logits, params, prompts, outputs)
    torch.testing.assert_close(logits, torch.tensor(expected), atol=1e-5, rtol=1e-5)


def test_min_new_tokens_masks_eos_and_stop_ids_until_reached():
    params = [SamplingParams(min_new_tokens=3, stop_token_ids=[7]), SamplingParams(min_new_tokens=3, ignore_eos=True),
              SamplingParams(min_new_tokens=2, stop_token_ids=[7])]
    outputs = [[1, 1], [1], [1, 1]]
    logits = torch.zeros(3, 10)
    mask_early_stops(logits, params, outputs, eos_token_ids=(2,))
    assert math.isinf(logits[0, 2]) and math.isinf(logits[0, 7])  # short of 3: EOS and the stop id banned
    assert logits[1, 2] == 0  # ignore_eos: EOS is an ordinary token
    assert logits[2].eq(0).all()  # 2 of 2 reached: nothing banned
