"""Presence, frequency and repetition penalties and min_new_tokens, against a row-by-row reference
written from their definitions (vLLM's and SGLang's)."""

import math
import random

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vlserve.core.sampling_params import SamplingParams
from vlserve.sampling.penalties import apply_logit_bias, apply_penalties, mask_early_stops


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


# ---- Logit bias, min_new_tokens masks and the penalty counts at their edges: token id 0, ids at or past
# the vocabulary (image pseudo-tokens), and logits not on the CPU (survivors of the mutation run on
# vlserve/sampling/penalties.py: benchmarks/results/mutation_scheduler.md). ----


VOCAB = 8


def test_logit_bias_adds_to_the_logit_and_ignores_ids_past_the_vocabulary():
    logits = torch.ones(2, VOCAB)
    apply_logit_bias(logits, [SamplingParams(logit_bias={3: 2.5, 0: -1.0, VOCAB: 50.0, VOCAB + 7: 50.0}),
                              SamplingParams()])
    expected = torch.ones(2, VOCAB)
    expected[0, 3], expected[0, 0] = 3.5, 0.0
    assert torch.equal(logits, expected)


def test_min_new_tokens_bans_token_id_0_and_ignores_ids_past_the_vocabulary():
    logits = torch.zeros(2, VOCAB)
    params = [SamplingParams(min_new_tokens=2, stop_token_ids=[VOCAB, 5]), SamplingParams(min_new_tokens=2)]
    mask_early_stops(logits, params, [[1], [1, 1]], eos_token_ids=(0,))
    banned = torch.zeros(2, VOCAB, dtype=torch.bool)
    banned[0, [0, 5]] = True  # the second row has its two tokens: nothing banned
    assert torch.equal(torch.isinf(logits), banned) and bool((logits[banned] < 0).all())


def test_penalty_counts_ignore_the_id_equal_to_the_vocabulary_size():
    logits = torch.full((1, VOCAB), 2.0)
    params = [SamplingParams(frequency_penalty=1.0, repetition_penalty=2.0)]
    apply_penalties(logits, params, prompts=[[1, VOCAB]], outputs=[[2, 2, VOCAB]])
    expected = torch.full((1, VOCAB), 2.0)
    expected[0, 1] = 1.0  # prompt: repetition only
    expected[0, 2] = 0.0  # output twice: 2 - 2 = 0, then 0 / 2
    assert torch.equal(logits, expected)


class DevicesSeen(TorchDispatchMode):
    """Records the device of every tensor (beyond 0-dim scalars) that an op takes or returns."""

    def __init__(self):
        super().__init__()
        self.devices: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.devices |= {t.device.type for t in tree_flatten((args, kwargs, out))[0]
                         if isinstance(t, torch.Tensor) and t.dim() > 0}
        return out


def test_penalties_keep_every_tensor_on_the_logits_device():
    # the meta device stands in for a GPU, where a CPU tensor in an op fails (index_put_'s values, a
    # product with the logits); the meta device itself lets some pass, so every op's tensors are recorded
    logits = torch.zeros(2, VOCAB, device="meta")
    params = [SamplingParams(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.5)] * 2
    with DevicesSeen() as seen:
        apply_penalties(logits, params, prompts=[[1, 2], [3]], outputs=[[4], [5, 5]])
    assert seen.devices == {"meta"}
