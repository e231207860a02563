"""The vision tower's attention through our batched CPU kernel, as a transformers attention function.

The towers are transformers' own classes (CLIP, SigLIP: vision.py); they call whatever attention
function their config names. On the CPU, torch's SDPA ran a video's 8 frames x 257 tokens of
bidirectional attention at about 110 GFLOP/s in bf16 (a third of the tower's time in video_qa);
kernels/cpu_attention.py runs the same products in bf16 dot products or fp32 register tiles. Each
image (or frame) is one request of the kernel with all its tokens new and causal=False, its K and V
the "pool" in token order.

Anything the kernel does not take (a mask, dropout, a causal module, a non-CPU tensor, or no
compiled kernel) goes to transformers' SDPA function, as before.
"""

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from vlserve.kernels import cpu_attention

NAME = "vlserve_cpu"


def cpu_vision_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """query [B, Hq, T, D], key / value [B, Hkv, T, D] -> ([B, T, Hq, D], None), as transformers' functions."""
    if (attention_mask is not None or dropout or getattr(module, "is_causal", False) or not query.is_cpu
            or query.dtype not in (torch.float32, torch.bfloat16) or cpu_attention.cpu_attention_op() is None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    batch, heads, tokens, dim = query.shape
    q = query.transpose(1, 2).reshape(batch * tokens, heads, dim)
    k = key.transpose(1, 2).reshape(batch * tokens, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(batch * tokens, value.shape[1], dim)
    out = torch.empty_like(q)
    table = torch.arange(batch * tokens, dtype=torch.int32).view(batch, tokens)
    lengths = torch.full((batch,), tokens, dtype=torch.int64)
    cpu_attention.extend_attention_cpu(q, k, v, out, table, torch.arange(batch), lengths, lengths,
                                       torch.arange(batch) * tokens, scaling, causal=False)
    return out.view(batch, tokens, heads, dim), None


AttentionInterface.register(NAME, cpu_vision_attention)
