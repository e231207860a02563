"""The linear layers' weights held once (packed for our kernel: vlserve/cpu/gemm.py) against the three
copies held before (the plain weight, oneDNN's blocked copy and the decode-rows kernel's), on
BENCH_SPEC (104.7 M parameters): prefill and decode tokens/s at batch 1, 8 and 32, in one run.

"before" is vlserve/cpu/gemm.py as it was at --before-rev (read with `git show`), applied to a model
loaded without the CPU GEMM path; "after" is the current one. Everything else (attention, fused ops,
the runner, the timing loop: benchmarks/per_token.py's Harness) is the same code in both. One dtype
per run; configurations alternate in order, --repeats times; medians and after/before ratios.

    python benchmarks/weight_layout.py --dtype float32 --out benchmarks/results/weight_layout_float32.md
    python benchmarks/weight_layout.py --dtype bfloat16 --out benchmarks/results/weight_layout_bfloat16.md
"""

import argparse
import os
import subprocess
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import per_token  # noqa: E402  (benchmarks/ is not a package)

from vlserve.bench.models import BENCH_SPEC, bench_model  # noqa: E402
from vlserve.bench.report import write_report  # noqa: E402
from vlserve.core.config import KernelConfig  # noqa: E402
from vlserve.model.loader import load_model  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gemm_at(rev: str) -> types.ModuleType:
    """vlserve/cpu/gemm.py as it was at `rev`, as a module of its own."""
    source = subprocess.run(["git", "-C", REPO, "show", f"{rev}:vlserve/cpu/gemm.py"], check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType(f"gemm_at_{rev}")
    exec(compile(source, f"{rev}:vlserve/cpu/gemm.py", "exec"), module.__dict__)
    # its copies were skipped past a quarter of MemFree (page cache not counted): on a busy machine
    # that turned its fast paths off; "before" here is its fast path, always packed
    module.PACK_MEMORY_SHARE = float("inf")
    return module


def loader(before: types.ModuleType):
    """load_model for the Harness: "before" configurations get the old module's CPU GEMM path."""
    def load(path, dtype, kernels):
        if kernels != "before":
            return load_model(path, dtype=dtype)
        loaded = load_model(path, dtype=dtype, kernels=KernelConfig(cpu_gemm=False))
        before.use_cpu_gemm(loaded.model)
        return loaded
    return load


def linear_bytes(model: torch.nn.Module) -> int:
    """Bytes the linear layers' weights hold: parameters and every packed copy kept beside them."""
    total = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            param = m._parameters.get("weight")
            total += 0 if param is None else param.numel() * param.element_size()
            for v in m.__dict__.values():
                copy = v[1] if isinstance(v, tuple) and len(v) == 2 else v
                if isinstance(copy, torch.Tensor) and not copy.is_mkldnn:
                    total += copy.numel() * copy.element_size()
                elif isinstance(copy, torch.Tensor):  # oneDNN's blocked copy: opaque, the plain size
                    total += param.numel() * param.element_size()
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--before-rev", default="cae97b8", help="the commit whose gemm.py kept three copies")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--prefix", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="cpu")
    ap.add_argument("--out", default="benchmarks/results/weight_layout.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    per_token.load_model = loader(gemm_at(args.before_rev))
    configs = {"before": {"kernels": "before", "attention": "torch", "dtype": args.dtype},
               "after": {"kernels": KernelConfig(), "attention": "torch", "dtype": args.dtype}}
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    context = args.prefix + args.prompt + args.steps + 8
    harnesses = {n: per_token.Harness(model_dir, c, max(args.batches), context, clock) for n, c in configs.items()}
    sizes = {n: linear_bytes(h.runner.model) for n, h in harnesses.items()}
    for h in harnesses.values():
        h.run(2, 16, 8, 2, seed=99)
    names = list(configs)
    results = per_token.run_alternating(harnesses, args)
    args.configs = ",".join(names)
    text = per_token.report(results, args, names).replace("Per computed token", f"{args.dtype}: per computed token", 1)
    text += "\n" + "".join(f"- {n}: the linear layers' weights hold {sizes[n] / 1e6:.0f} MB\n" for n in names)
    write_report(args.out, text)


if __name__ == "__main__":
    main()
