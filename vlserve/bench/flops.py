"""The compute roofline of a workload: the FLOPs an ideal cache must compute, and the CPU's GEMM peak.

FLOPs that had to be computed — an ideal cache computes each distinct prompt prefix once:
- decoder: every node of the union trie of the prompts' token ids (pseudo-token ids for images) at
  its depth p: 2 x decoder linear parameters + attention 4 x (p + 1) x q_heads x head_dim per layer;
  then every decode forward (max_new_tokens - 1 per request) at its position likewise;
- lm_head: 2 x hidden x vocab per sampled token (max_new_tokens per request);
- vision: every distinct image (by content hash) once through the CLIP tower up to the deepest layer
  LLaVA reads (patch conv, 2 x linear parameters per token, attention 4 x tokens x hidden per token per
  layer) and the projector.

GEMM peak: the fastest of F.linear and the CPU GEMM path (cpu/gemm.py, CpuLinear) on a prefill-sized
GEMM (rows x 1024 -> 2816, BENCH_SPEC's MLP), with the caller's torch threads. Used by
benchmarks/roofline.py and recorded by benchmarks/workloads.py around every workload.
"""

import time

import torch
import torch.nn.functional as F
from torch import nn

from vlserve.bench.client import Job
from vlserve.bench.own_thread import on_own_thread
from vlserve.cpu.gemm import CpuLinear
from vlserve.model.vision import kept_layers

PEAK_ROWS = 2048


def linear_params(module: nn.Module) -> int:
    # in x out, not .weight: a packed CpuLinear derives its weight when asked (cpu/gemm.py)
    return sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def decoder_flops(model, cfg, positions: list[int]) -> float:
    """Decoder FLOPs for tokens at these positions (embedding lookups are free, lm_head separate)."""
    t = cfg.text
    per_token = 2 * linear_params(model.language_model)
    attention = 4 * t.num_heads * t.head_dim * t.num_layers
    return sum(per_token + attention * (p + 1) for p in positions)


def vision_flops(model, cfg) -> float:
    """One image through the CLIP tower and the projector."""
    vc = cfg.vision_hf_config
    patches = (cfg.image_size // cfg.patch_size) ** 2
    tokens = patches + 1  # + CLS
    conv = 2 * 3 * cfg.patch_size ** 2 * vc.hidden_size * patches
    tower = 2 * linear_params(model.vision.vision_tower) * tokens
    attention = 4 * tokens * tokens * vc.hidden_size * kept_layers(cfg)
    projector = 2 * linear_params(model.vision.multi_modal_projector) * cfg.tokens_per_image
    return conv + tower + attention + projector


def trie_depths(sequences: list[list[int]]) -> list[int]:
    """Depth (position) of every node of the union trie: the prompt tokens computed once each."""
    root: dict = {}
    depths = []
    for seq in sequences:
        node = root
        for depth, tok in enumerate(seq):
            if tok not in node:
                node[tok] = {}
                depths.append(depth)
            node = node[tok]
    return depths


def required_flops(engine, jobs: list[Job]) -> dict[str, float]:
    model, cfg = engine.loaded.model, engine.loaded.config
    reqs = [engine.make_request(prompt=j.prompt, image_data=j.images or None, video_data=j.videos or None)
            for j in jobs]
    prompts = [r.input_ids for r in reqs]
    decode_positions = [len(p) + i for p, j in zip(prompts, jobs) for i in range(j.max_new_tokens - 1)]
    images = {span.content_hash for r in reqs for span in r.images}
    sampled = sum(j.max_new_tokens for j in jobs)
    return {
        "prefill (unique prompt tokens)": decoder_flops(model, cfg, trie_depths(prompts)),
        "decode": decoder_flops(model, cfg, decode_positions),
        "lm_head": 2.0 * cfg.text.hidden_size * cfg.text.vocab_size * sampled,
        "vision (unique images)": vision_flops(model, cfg) * len(images),
        "_counts": (len(trie_depths(prompts)), len(decode_positions), len(images)),
    }


def gemm_peak(rows: int = PEAK_ROWS, seconds: float = 1.0, dtype: torch.dtype = torch.float32) -> tuple[float, str]:
    """GFLOP/s of the fastest path on a [rows, 1024] x [1024, 2816] product in `dtype` (a bf16 run's
    roofline is bf16's peak: on AVX512_BF16 about twice fp32's). Measured on a thread of its own
    (own_thread.py), which leaves no OpenMP workers behind to share the cores with the engine's."""
    return on_own_thread(lambda: _gemm_peak(rows, seconds, dtype), "gemm-peak")


def _gemm_peak(rows: int, seconds: float, dtype: torch.dtype) -> tuple[float, str]:
    torch.manual_seed(0)
    dense = nn.Linear(1024, 2816, bias=False).to(dtype)
    fast = CpuLinear(1024, 2816, bias=False).to(dtype)
    fast.weight = dense.weight
    x = torch.randn(rows, 1024, dtype=dtype)
    best = (0.0, "")
    with torch.inference_mode():
        for name, fn in (("F.linear", lambda: F.linear(x, dense.weight)), ("CpuLinear", lambda: fast(x))):
            fn()
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                fn()
                n += 1
            gflops = 2 * rows * 1024 * 2816 * n / (time.perf_counter() - start) / 1e9
            best = max(best, (gflops, name))
    return best
