"""Batch-1 decode against the machine's memory bandwidth: decode is bound by streaming the weights,
so its achieved weight bandwidth (the bytes of the weights a token reads / the time per token) is
reported as a share of the copy bandwidth measured in the same run, beside the compute roofline.

- Copy bandwidth: a tensor copy of --copy-mb MB (larger than the caches), bytes read + bytes written
  per second (STREAM's "copy" count); and a read-only pass (a sum) for reference. Best of --repeats.
- Decode: a random LLaVA checkpoint written by the project's tiny writer (--hidden, --intermediate,
  --layers, --vocab: ~100 M parameters, 400 MB in fp32, by default; or --spec, a real size of
  vlserve/bench/models.py, e.g. qwen2-0.5b-siglip, written once under /tmp/vlserve-bench-models), loaded
  as the engine loads it (every fast path on), decoding one request (benchmarks/per_token.py's
  Harness) for --steps tokens. Weight bytes per token: the decoder's and the LM head's linear layers
  in their resident layout (the embedding reads one row; a tied one, from the LM head's layout). The
  vision tower takes no part in decode.
- Compute roofline: 2 x those linear parameters FLOPs per token at the CPU GEMM peak
  (vlserve.bench.flops.gemm_peak, as benchmarks/roofline.py uses).
- The linear layers alone: one row through each of them in turn and nothing else, the same bytes:
  what the kernel reaches apart from the rest of a step (attention, norms, batch building, Python).

    python benchmarks/decode_bandwidth.py --threads 2 --out benchmarks/results/decode_bandwidth.md
    python benchmarks/decode_bandwidth.py --threads 1 --clock cpu --out benchmarks/results/decode_bandwidth_cpu1.md
    python benchmarks/decode_bandwidth.py --spec qwen2-0.5b-siglip --out benchmarks/results/decode_bandwidth_0.5b.md
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import per_token  # noqa: E402  (benchmarks/ is not a package)

from vlserve.bench.flops import gemm_peak  # noqa: E402
from vlserve.bench.models import SPECS, bench_model  # noqa: E402
from vlserve.bench.report import write_report  # noqa: E402
from vlserve.core.config import KernelConfig  # noqa: E402
from vlserve.cpu.gemm import CpuLinear  # noqa: E402
from vlserve.testing.tiny import TinyModelSpec  # noqa: E402


def copy_bandwidth(megabytes: int, repeats: int, clock=time.perf_counter) -> tuple[float, float]:
    """(copy GB/s counting read + write, read-only GB/s), best of `repeats`."""
    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy = read = 0.0
    for _ in range(repeats):
        start = clock()
        dst.copy_(src)
        copy = max(copy, 2 * src.nbytes / (clock() - start) / 1e9)
        start = clock()
        src.sum()
        read = max(read, src.nbytes / (clock() - start) / 1e9)
    return copy, read


def decode_weight_bytes(model) -> tuple[int, int]:
    """(bytes, parameters) of the linear layers a decode step reads: the decoder's and the LM head, in
    their resident layout (packed, or the plain weight)."""
    size = params = 0
    for part in (model.language_model, model.lm_head):
        for m in part.modules():
            if isinstance(m, torch.nn.Linear):
                params += m.in_features * m.out_features
                packed = m.packed if isinstance(m, CpuLinear) else None
                size += packed.nbytes if packed is not None else m.weight.nbytes
    return size, params


def linears_only(model, dtype: torch.dtype, clock, repeats: int) -> float:
    """Seconds for one row through every linear layer a decode step reads, in the step's order, and
    nothing else: the GEMMs' share of a step (median of `repeats`)."""
    layers = [m for part in (model.language_model, model.lm_head) for m in part.modules()
              if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(1, m.in_features).to(dtype) for m in layers]
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            start = clock()
            for m, x in zip(layers, inputs):
                m(x)
            times.append(clock() - start)
    return statistics.median(times[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--copy-mb", type=int, default=512)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: the process's CPU time, for one thread on a machine other jobs share")
    ap.add_argument("--spec", choices=sorted(SPECS), help="a benchmark checkpoint of vlserve/bench/models.py "
                    "instead of --hidden/--intermediate/--layers/--vocab (--model defaults to its folder)")
    ap.add_argument("--model", help="the checkpoint's folder (default /tmp/vlserve-bench-models/decode-bandwidth, "
                    "or the --spec's name there); written there if missing")
    ap.add_argument("--out", default="benchmarks/results/decode_bandwidth.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.spec:
        spec = SPECS[args.spec]
    else:
        spec = TinyModelSpec(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                             num_layers=args.layers, num_heads=args.hidden // 64,
                             num_kv_heads=max(1, args.hidden // 256), vision_hidden=64, vision_layers=1,
                             image_size=32, patch_size=8, max_position_embeddings=4096)
    model_dir = args.model or os.path.join("/tmp/vlserve-bench-models", args.spec or "decode-bandwidth")
    bench_model(model_dir, spec)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    copy, read = copy_bandwidth(args.copy_mb, args.repeats, clock)
    lines = [f"Batch-1 decode against copy bandwidth: torch {torch.__version__}, {args.threads} threads, "
             f"{torch.backends.cpu.get_cpu_capability()}, {args.clock} clock, load average "
             f"{os.getloadavg()[0]:.1f}; model {args.spec or 'decode-bandwidth'}: hidden {spec.hidden_size}, "
             f"intermediate {spec.intermediate_size}, {spec.num_layers} layers, vocab {spec.vocab_size}"
             f"{', tied embeddings' if spec.tie_word_embeddings else ''}; "
             f"{args.steps} decode steps, median of {args.repeats}. Copy bandwidth {copy:.1f} GB/s (read + write), "
             f"read-only {read:.1f} GB/s.\n",
             "| dtype | weight MB read per token | ms per token | tokens/s | achieved GB/s | share of copy | "
             "linear layers alone GB/s (share of copy) | share of read-only | compute roofline tokens/s | "
             "bandwidth roofline tokens/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        config = {"kernels": KernelConfig(), "attention": "torch", "dtype": name}
        harness = per_token.Harness(model_dir, config, 1, 64 + args.steps, clock)
        size, params = decode_weight_bytes(harness.runner.model)
        harness.run(1, 16, 0, 4, seed=99)
        times = [harness.run(1, 16, 0, args.steps, seed=r)[1] / args.steps for r in range(args.repeats)]
        per_token_s = statistics.median(times)
        achieved = size / per_token_s / 1e9
        gemms = size / linears_only(harness.runner.model, dtype, clock, args.repeats) / 1e9
        peak, _ = gemm_peak(dtype=dtype)
        lines.append(f"| {name} | {size / 1e6:.0f} | {per_token_s * 1e3:.2f} | {1 / per_token_s:.1f} | "
                     f"{achieved:.1f} | {achieved / copy:.0%} | {gemms:.1f} ({gemms / copy:.0%}) | "
                     f"{achieved / read:.0%} | "
                     f"{peak * 1e9 / (2 * params):.0f} | {copy * 1e9 / size:.1f} |")
        print(lines[-1], flush=True)
        del harness
    write_report(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
