"""In float16 and bfloat16 the Engine's next-token choice and log-probability track transformers' own.

Bug caught: half-precision numerics that drift from transformers' (RMSNorm or softmax without the
float32 upcast, cos/sin rounded before the rotation, logits taken in half precision): every parity
test elsewhere runs in float32. Teacher-forced (one new token per prompt), so one early difference
does not decide the rest. On the trained built-in model: a random tiny model's near-uniform attention
and flat logits hide such bugs (dropping RMSNorm's upcast passed on one, fails here).
"""

import pytest
import torch

from vlserve import Engine
from vlserve.model.builtin import BUILTIN_MODEL_DIR

N_PROMPTS = 64
# (dtype, logprob tolerance, floor on the share of prompts where the Engine's token is transformers'
# argmax). Each side drifts from float32 on its own, so the two can differ by the sum of their drifts.
# Measured on the built-in model's stage 15: in bfloat16 transformers drifts up to 0.117 from its own
# float32, the Engine 0.113, and the two differ by up to 0.158 (64/64 agree); float16 passes at 0.08.
# Without RMSNorm's float32 upcast the Engine differs by 0.28 in bfloat16 with 60/64 agreeing (an
# earlier checkpoint: 0.35; float16 27 and 51/64).
CASES = [("bfloat16", 0.2, 0.95), ("float16", 0.08, 0.95)]


@pytest.fixture(scope="module")
def checkpoint():
    return str(BUILTIN_MODEL_DIR)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(4, 40, (N_PROMPTS,), generator=gen).tolist()
    return [[1] + torch.randint(5, 2900, (n,), generator=gen).tolist() for n in lens]


@torch.no_grad()
def _hf_logprobs(checkpoint: str, dtype: str, prompts: list[list[int]]) -> list[torch.Tensor]:
    from transformers import LlavaForConditionalGeneration

    hf = LlavaForConditionalGeneration.from_pretrained(checkpoint, dtype=getattr(torch, dtype)).eval()
    return [torch.log_softmax(hf(input_ids=torch.tensor([p])).logits[0, -1].float(), dim=-1) for p in prompts]


@pytest.mark.parametrize("dtype,tolerance,floor", CASES)
def test_half_precision_matches_transformers_in_the_same_dtype(checkpoint, dtype, tolerance, floor):
    """64 prompts, one greedy token each: logprob of the Engine's token within the dtype's tolerance of transformers',
    and the Engine's token is transformers' argmax for at least `floor` of the prompts."""
    prompts = _prompts()
    with Engine(checkpoint, dtype=dtype, max_total_tokens=4096) as engine:
        outs = engine.generate(input_ids=prompts, return_logprob=True,
                               sampling_params={"max_new_tokens": 1, "temperature": 0, "ignore_eos": True})
    refs = _hf_logprobs(checkpoint, dtype, prompts)
    agree = 0
    for out, ref in zip(outs, refs):
        (logprob, token), = out["meta_info"]["output_token_logprobs"]
        assert abs(logprob - float(ref[token])) <= tolerance, f"{dtype}: {logprob} vs {float(ref[token])}"
        agree += token == int(ref.argmax())
    assert agree / len(prompts) >= floor, f"{dtype}: {agree}/{len(prompts)} greedy tokens agree"
