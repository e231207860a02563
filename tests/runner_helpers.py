"""Driving the model runner directly (no scheduler): a batch of prompts prefilled together, then one
token per request per step — how the parity tests compare the paged model with transformers."""

import torch

from vlserve.core.forward_batch import ExtendSlice, build_forward_batch


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
