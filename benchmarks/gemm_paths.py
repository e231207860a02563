"""Which GEMM path is fastest on this CPU, per dtype, at the row counts decode and prefill run.

Paths (all shipped with torch's CPU build):
- mkl:          F.linear, fp32 (MKL sgemm)
- mkl_packed:   torch.ops.mkl._mkl_linear on a weight pre-packed by cblas_sgemm_pack, fp32
- onednn:       torch.ops.mkldnn._linear_pointwise on a weight reordered for oneDNN
- bf16:         F.linear in bf16 / bf16 oneDNN with a reordered weight (bf16_onednn)
- small:        our small-row kernel (vlserve.kernels.small_gemm), fp32, below its 32-row limit
- small_no_prefetch: the same without its software prefetch of the next column block's weights

Layer shapes are BENCH_SPEC's decoder (qkv, o, gate_up, down, lm_head). Paths are timed in turn,
in alternating order, `--repeats` times; the table gives the median GFLOP/s and each path's ratio
to mkl in the same run.

    python benchmarks/gemm_paths.py --threads 2 --out benchmarks/results/gemm_paths.md
    python benchmarks/gemm_paths.py --threads 1 --clock cpu --out benchmarks/results/gemm_paths_cpu1.md

--copies N times each path over N copies of the weight in turn: with N x the layer's size past the
last-level cache (4 copies of gate_up are 92 MB), every call streams its weight from memory, as a
model's layers do in serving; with 1 copy a layer up to 23 MB stays in a 32 MB L3 between calls.
"""

import argparse
import itertools
import os
import statistics
import time

import torch
import torch.nn.functional as F

from vlserve.bench.report import write_report
from vlserve.kernels import small_gemm

SHAPES = {"qkv": (1024, 1536), "o": (1024, 1024), "gate_up": (1024, 5632), "down": (2816, 1024),
          "lm_head": (1024, 4000)}


def make_paths(w: torch.Tensor, rows: int) -> dict:
    paths = {"mkl": (lambda x: F.linear(x, w), torch.float32)}
    if hasattr(torch.ops.mkl, "_mkl_linear"):
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
        paths["mkl_packed"] = (lambda x: torch.ops.mkl._mkl_linear(x, packed, w, None, rows), torch.float32)
    if torch.backends.mkldnn.is_available():
        reordered = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        paths["onednn"] = (lambda x: torch.ops.mkldnn._linear_pointwise(x, reordered, None, "none", [], ""),
                           torch.float32)
    wb = w.bfloat16()
    paths["bf16"] = (lambda x: F.linear(x, wb), torch.bfloat16)
    small = small_gemm.small_linear_op()
    if small is not None and rows < small_gemm.MAX_ROWS:
        paths["small"] = (lambda x: small(x, w, None), torch.float32)
        paths["small_no_prefetch"] = (lambda x: small(x, w, None, prefetch=False), torch.float32)
    if torch.backends.mkldnn.is_available():
        try:
            reordered_b = torch.ops.mkldnn._reorder_linear_weight(wb, rows)
            paths["bf16_onednn"] = (
                lambda x: torch.ops.mkldnn._linear_pointwise(x, reordered_b, None, "none", [], ""), torch.bfloat16)
        except RuntimeError:
            pass
    return paths


CLOCK = [time.perf_counter]  # --clock cpu: time.process_time (see benchmarks/per_token.py)


def time_call(fn, x, min_seconds: float) -> float:
    fn(x)
    clock = CLOCK[0]
    n, start = 0, clock()
    while True:
        fn(x)
        n += 1
        elapsed = clock() - start
        if elapsed >= min_seconds:
            return elapsed / n


def over_copies(weights: list[torch.Tensor], rows: int) -> dict:
    """make_paths for each copy; each path's function calls the copies in turn."""
    per_copy = [make_paths(w, rows) for w in weights]

    def cycling(fns):
        turn = itertools.cycle(fns)
        return lambda x: next(turn)(x)

    return {p: (cycling([paths[p][0] for paths in per_copy]), dtype) for p, (_, dtype) in per_copy[0].items()}


def measure(rows_list, repeats: int, min_seconds: float, copies: int = 1) -> list[dict]:
    out = []
    torch.manual_seed(0)
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k) / k ** 0.5
        weights = [w] + [w.clone() for _ in range(copies - 1)]
        for rows in rows_list:
            x = torch.randn(rows, k)
            paths = over_copies(weights, rows)
            ref = F.linear(x, w)
            for path, (fn, dtype) in paths.items():  # every path computes the same product
                err = ((fn(x.to(dtype)).float() - ref).abs().max() / ref.abs().max()).item()
                assert err < (2e-2 if dtype == torch.bfloat16 else 1e-4), (name, rows, path, err)
            times = {p: [] for p in paths}
            for rep in range(repeats):
                order = list(paths) if rep % 2 == 0 else list(reversed(paths))
                for path in order:
                    fn, dtype = paths[path]
                    times[path].append(time_call(fn, x.to(dtype), min_seconds))
            flops = 2 * rows * k * n
            base = statistics.median(times["mkl"])
            for path, ts in times.items():
                t = statistics.median(ts)
                out.append({"layer": name, "k": k, "n": n, "rows": rows, "path": path, "ms": t * 1e3,
                            "gflops": flops / t / 1e9, "vs_mkl": base / t})
    return out


def table(results: list[dict]) -> str:
    paths = list(dict.fromkeys(r["path"] for r in results))
    lines = ["| layer (k→n) | rows | " + " | ".join(f"{p} GFLOP/s (x mkl)" for p in paths) + " |",
             "| --- | ---: | " + " | ".join("---:" for _ in paths) + " |"]
    keys = list(dict.fromkeys((r["layer"], r["k"], r["n"], r["rows"]) for r in results))
    for layer, k, n, rows in keys:
        cells = []
        for p in paths:
            r = next((r for r in results if (r["layer"], r["rows"], r["path"]) == (layer, rows, p)), None)
            cells.append("—" if r is None else f"{r['gflops']:.0f} ({r['vs_mkl']:.2f})")
        lines.append(f"| {layer} ({k}→{n}) | {rows} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 256, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=0.2)
    ap.add_argument("--copies", type=int, default=1, help="copies of each weight, timed in turn (see above)")
    ap.add_argument("--layers", nargs="+", default=list(SHAPES))
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: process CPU time, for a machine shared with other jobs (use with --threads 1)")
    ap.add_argument("--out", default="benchmarks/results/gemm_paths.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    CLOCK[0] = time.perf_counter if args.clock == "wall" else time.process_time
    for name in list(SHAPES):
        if name not in args.layers:
            del SHAPES[name]
    results = measure(args.rows, args.repeats, args.min_seconds, args.copies)
    text = (f"GEMM paths, torch {torch.__version__}, {args.threads} threads, {args.clock} clock, "
            f"{args.copies} cop{'y' if args.copies == 1 else 'ies'} of each weight, "
            f"load average {os.getloadavg()[0]:.1f}, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}, oneDNN bf16 supported: "
            f"{torch.ops.mkldnn._is_mkldnn_bf16_supported()}\n\n" + table(results) + "\n")
    write_report(args.out, text)


if __name__ == "__main__":
    main()
