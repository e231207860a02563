"""Through the Engine, every RoPE variant gives transformers' greedy ids and their log-probabilities.

Bugs caught: default RoPE ignoring rope_theta (1e6 here, as Mistral and Qwen2), a scaled type
(llama3, yarn with its attention factor, LongRoPE's switch to the long factors past the original
context) computed differently from transformers. Complements test_parity_transformers.py (full
logits of the paged model) with the serving path: scheduler, batching, radix cache, sampler.
"""

import pytest
import torch

from helpers.rope_shapes import ROPE_SHAPES
from vlserve import Engine
from vlserve.testing.tiny import make_tiny_model

STEPS = 40
PROMPT_LENS = (5, 20, 40)  # LongRoPE's 32 is crossed in decode, in decode, in the prompt


@pytest.fixture(scope="module", params=sorted(ROPE_SHAPES))
def checkpoint(request, tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp(request.param)), seed=2, spec=ROPE_SHAPES[request.param])


@torch.no_grad()
def _hf_greedy(hf, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """transformers alone, one request, KV cache: greedy ids and the log-probability of each."""
    out_ids, logprobs, past, input_ids = [], [], None, torch.tensor([ids])
    for _ in range(steps):
        out = hf(input_ids=input_ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        nxt = int(lp.argmax())
        out_ids.append(nxt)
        logprobs.append(float(lp[nxt]))
        input_ids = torch.tensor([[nxt]])
    return out_ids, logprobs


def test_engine_greedy_ids_match_transformers(checkpoint):
    """A batch of prompts of 5, 20 and 40 tokens, 40 greedy steps each: identical ids, logprobs
    within 1e-4."""
    from transformers import LlavaForConditionalGeneration

    hf = LlavaForConditionalGeneration.from_pretrained(checkpoint).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = [[1] + torch.randint(5, 300, (n - 1,), generator=gen).tolist() for n in PROMPT_LENS]
    with Engine(checkpoint, max_total_tokens=2048) as engine:
        outs = engine.generate(input_ids=prompts, return_logprob=True,
                               sampling_params={"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True})
    for prompt, out in zip(prompts, outs):
        ref_ids, ref_lps = _hf_greedy(hf, prompt, STEPS)
        assert out["output_ids"] == ref_ids, f"prompt of {len(prompt)} tokens"
        lps = [lp for lp, _ in out["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(lps, ref_lps)) < 1e-4
