"""Driving the model runner directly (no scheduler): a batch of prompts prefilled together, then one
token per request per step — how the parity tests compare the paged model with transformers."""

import torch

from vlserve.core.forward_batch import ExtendSlice, build_forward_batch
from vlserve.testing.compressed_reference import greedy_logits


def batched_logits(runner, cfg, prompts, pixels, steps: int, choose, image_sizes=None) -> list[list]:
    """prompts: [(ids, number of images)]; pixels: per prompt [k, 3, H, W] (or a list of k anyres
    [views, 3, H, W], with image_sizes per prompt) or None. choose(step, logits) gives each
    request's next token. Returns per request the logits after the prompt and each step."""
    memory = runner.memory
    rows = [memory.req_to_token.alloc() for _ in prompts]

    def slice_for(i, prefix_len, ids, embeds=None, image_rows=()):
        last = memory.req_to_token.table[rows[i], prefix_len - 1].item() if prefix_len else -1
        slots = memory.allocator.alloc_extend(last, prefix_len, len(ids))
        memory.req_to_token.write(rows[i], prefix_len, slots)
        return ExtendSlice(rows[i], prefix_len, ids, slots, embeds, list(image_rows))

    def forward(slices):
        return runner.forward(build_forward_batch(slices, memory.req_to_token.table, runner.vocab_size))

    slices = []
    for i, ((ids, k), px) in enumerate(zip(prompts, pixels)):
        image_rows = [j for j, t in enumerate(ids) if t == cfg.image_token_id]
        embeds = torch.cat(runner.encode_images(list(px), image_sizes[i] if image_sizes else None)) if k else None
        slices.append(slice_for(i, 0, ids, embeds, image_rows))
    out, logits = [[] for _ in prompts], forward(slices)
    for step in range(steps + 1):
        for i in range(len(prompts)):
            out[i].append(logits[i])
        if step == steps:
            return out
        tokens = choose(step, logits)
        logits = forward([slice_for(i, len(prompts[i][0]) + step, [tokens[i]]) for i in range(len(prompts))])


def parity_prompts(cfg, vocab, gen):
    """Requests with 0, 1 and 2 images at the start, middle and end, of different lengths."""
    img = cfg.image_token_id
    n = cfg.tokens_per_image

    def text(k):
        return torch.randint(5, vocab, (k,), generator=gen).tolist()

    return [
        (text(7), 0),
        ([img] * n + text(5), 1),
        (text(3) + [img] * n + text(4) + [img] * n + text(2), 2),
        (text(9) + [img] * n, 1),
    ]


def hf_greedy_logits(hf, ids, pixels, steps):
    """Per-request reference: logits of the prompt's last token, then of each greedy decode step."""
    return list(greedy_logits(hf, ids, pixels, steps))


def assert_runner_matches_transformers(checkpoint: str, page_size: int, steps: int = 32) -> None:
    """The paged model (no scheduler) against transformers' LlavaForConditionalGeneration, fp32: the
    parity_prompts batch prefilled together, then greedy steps; every logits row within 1e-4 and the
    same greedy ids."""
    from transformers import LlavaForConditionalGeneration

    from vlserve.model.loader import load_model
    from vlserve.runner.model_runner import ModelRunner

    loaded = load_model(checkpoint)
    hf = LlavaForConditionalGeneration.from_pretrained(checkpoint).eval()
    cfg = loaded.config
    gen = torch.Generator().manual_seed(0)
    prompts = parity_prompts(cfg, cfg.text.vocab_size, gen)
    pixels = [torch.randn(k, 3, cfg.image_size, cfg.image_size, generator=gen) if k else None for _, k in prompts]
    runner = ModelRunner.standalone(loaded, max_total_tokens=1024, page_size=page_size)
    native = batched_logits(runner, cfg, prompts, pixels, steps,
                            lambda step, logits: [int(row.argmax()) for row in logits])

    for i, ((ids, _), px) in enumerate(zip(prompts, pixels)):
        ref = hf_greedy_logits(hf, ids, px, steps)
        for step, (a, b) in enumerate(zip(native[i], ref)):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (f"request {i} step {step}: "
                                                                f"max diff {(a - b).abs().max()}")
        assert [int(x.argmax()) for x in native[i]] == [int(x.argmax()) for x in ref]
