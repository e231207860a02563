"""How close a workload gets to the CPU's GEMM roofline.

FLOPs that had to be computed — an ideal cache computes each distinct prompt prefix once:
- decoder: every node of the union trie of the prompts' token ids (pseudo-token ids for images) at
  its depth p: 2 x decoder linear parameters + attention 4 x (p + 1) x q_heads x head_dim per layer;
  then every decode forward (max_new_tokens - 1 per request) at its position likewise;
- lm_head: 2 x hidden x vocab per sampled token (max_new_tokens per request);
- vision: every distinct image (by content hash) once through the CLIP tower (patch conv, 2 x linear
  parameters per token, attention 4 x tokens x hidden per token per layer) and the projector.

GEMM peak: the fastest of F.linear and the CPU GEMM path (cpu_gemm.CpuLinear) on a prefill-sized
GEMM (--peak-rows x 1024 -> 2816, BENCH_SPEC's MLP), measured in the same run with the same threads.

Achieved: those FLOPs over the workload's wall time through the offline Engine (one batch after a
warm-up request, as benchmarks/workloads.py runs it). Share = achieved / peak.

    python benchmarks/roofline.py --workload questions_per_image --out benchmarks/results/roofline.md
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from vlserve.bench import workloads as W
from vlserve.bench.client import EngineClient, Job
from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.bench.report import write_report
from vlserve.model.cpu_gemm import CpuLinear


def linear_params(module: nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


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
    attention = 4 * tokens * tokens * vc.hidden_size * vc.num_hidden_layers
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


def gemm_peak(rows: int, seconds: float = 1.0) -> tuple[float, str]:
    """GFLOP/s of the fastest path on a [rows, 1024] x [1024, 2816] product."""
    torch.manual_seed(0)
    dense = nn.Linear(1024, 2816, bias=False)
    fast = CpuLinear(1024, 2816, bias=False)
    fast.weight = dense.weight
    x = torch.randn(rows, 1024)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="questions_per_image", choices=list(W.WORKLOADS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peak-rows", type=int, default=2048)
    ap.add_argument("--model")
    ap.add_argument("--out", default="benchmarks/results/roofline.md")
    args = ap.parse_args()
    from vlserve import Engine

    torch.set_num_threads(args.threads)
    model_dir = args.model or bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    jobs = W.WORKLOADS[args.workload]()
    peak_before, path_before = gemm_peak(args.peak_rows)
    with Engine(model_dir, num_threads=args.threads) as engine:
        flops = required_flops(engine, jobs)
        client = EngineClient(engine)
        client.generate([Job("USER: warm up the engine ASSISTANT:", max_new_tokens=2, ignore_eos=True)])
        start = time.monotonic()
        client.generate(jobs)
        wall = time.monotonic() - start
    peak_after, path_after = gemm_peak(args.peak_rows)
    peak = max(peak_before, peak_after)
    counts = flops.pop("_counts")
    total = sum(flops.values())
    achieved = total / wall / 1e9
    lines = [f"Roofline, workload {args.workload} ({len(jobs)} requests), BENCH_SPEC, {args.threads} threads.", "",
             "| FLOPs that had to be computed | GFLOP |", "| --- | ---: |"]
    lines += [f"| {k} | {v / 1e9:.1f} |" for k, v in flops.items()]
    lines += [f"| total | {total / 1e9:.1f} |", "",
              f"Counts: {counts[0]} unique prompt tokens, {counts[1]} decode forwards' tokens, {counts[2]} unique images.",
              "",
              "| figure | value |", "| --- | ---: |",
              f"| GEMM peak ({args.peak_rows}x1024x2816; before / after the run) | {peak_before:.0f} ({path_before}) / "
              f"{peak_after:.0f} ({path_after}) GFLOP/s |",
              f"| workload wall time | {wall:.2f} s |",
              f"| achieved | {achieved:.1f} GFLOP/s |",
              f"| share of the GEMM roofline | {achieved / peak:.1%} |"]
    write_report(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
