"""How close a workload gets to the CPU's GEMM roofline (the FLOPs that had to be computed over the
wall time, against the GEMM peak measured in the same run; vlserve/bench/flops.py defines both).

Two modes:
- one workload through vlserve's offline Engine (one timed batch after a warm-up request, as
  `benchmarks/workloads.py --batches 1` runs it), the GEMM peak measured before and after it:

    python benchmarks/roofline.py --workload questions_per_image --out benchmarks/results/roofline.md
    python benchmarks/roofline.py --workload few_shot --dtype bfloat16   # bf16 weights and KV, bf16's peak

- every system of a workloads.py run, from its JSON (wall time per system and repeat, the fastest of its
  timed batches where it timed several, every batch's share beside it; the GEMM
  peak workloads.py measured before and after each workload in that run, and, where recorded, just
  before and after each system's run: a second share against those, which follows the host's slow
  spells that a peak taken minutes away misses):

    python benchmarks/roofline.py --results benchmarks/results/issue15_fp32_final \
        --out benchmarks/results/roofline_all.md
"""

import glob
import json
import os
import time

import torch

from vlserve.bench import workload_defs as W
from vlserve.bench.client import EngineClient
from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.bench.harness import bench_parser, threads_from, warm_up
from vlserve.bench.report import provenance, write_report
from vlserve.bench.flops import PEAK_ROWS, gemm_peak, required_flops


def one_workload(args) -> str:
    from vlserve import Engine

    model_dir = args.model or bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    jobs = W.WORKLOADS[args.workload]()
    dtype = getattr(torch, args.dtype)
    peak_before, path_before = gemm_peak(args.peak_rows, dtype=dtype)
    with Engine(model_dir, num_threads=args.threads, dtype=args.dtype, video_frames=8) as engine:
        flops = required_flops(engine, jobs)
        client = EngineClient(engine)
        warm_up(client)
        start = time.monotonic()
        client.generate(jobs)
        wall = time.monotonic() - start
    peak_after, path_after = gemm_peak(args.peak_rows, dtype=dtype)
    peak = max(peak_before, peak_after)
    counts = flops.pop("_counts")
    total = sum(flops.values())
    achieved = total / wall / 1e9
    lines = [f"Roofline, workload {args.workload} ({len(jobs)} requests), BENCH_SPEC, {args.dtype}, "
             f"{args.threads} threads.", "",
             "| FLOPs that had to be computed | GFLOP |", "| --- | ---: |"]
    lines += [f"| {k} | {v / 1e9:.1f} |" for k, v in flops.items()]
    lines += [f"| total | {total / 1e9:.1f} |", "",
              f"Counts: {counts[0]} unique prompt tokens, {counts[1]} decode forwards' tokens, "
              f"{counts[2]} unique images.",
              "",
              "| figure | value |", "| --- | ---: |",
              f"| GEMM peak ({args.peak_rows}x1024x2816 in {args.dtype}; before / after the run) "
              f"| {peak_before:.0f} ({path_before}) / {peak_after:.0f} ({path_after}) GFLOP/s |",
              f"| workload wall time | {wall:.2f} s |",
              f"| achieved | {achieved:.1f} GFLOP/s |",
              f"| share of the GEMM roofline | {achieved / peak:.1%} |"]
    return "\n".join(lines) + "\n"


def from_results(args) -> str:
    """Every system and repeat of a workloads.py run: FLOPs / wall / that workload's GEMM peak."""
    from vlserve import Engine

    results = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(args.results, "*.json")))]
    results = [r for r in results if r.get("workload") in W.WORKLOADS]
    if not results:
        raise SystemExit(f"no workloads.py results (<workload>.json) in {args.results}")
    model_dir = args.model or bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    lines = [f"Roofline of every system in `{args.results}` ({results[0].get('meta', {}).get('command', '?')}); "
             "FLOPs that had to be computed (vlserve/bench/flops.py) over each system's wall time, against the "
             f"GEMM peak ({PEAK_ROWS}x1024x2816, in the run's dtype: {results[0].get('dtype', 'float32')}) "
             "that workloads.py measured before and after the workload in that run; each share is held to the higher "
             "of the two. Where recorded, the peak was also sampled just before and just after each system's run "
             "(for vlserve around the timed batches, for a peer around its whole call): 'share against it' holds the "
             "run to the higher of those two. Where the run timed several batches (workloads.py --batches, caches "
             "emptied before each), wall s is the fastest one's, and the last column gives every batch's share "
             "against the workload's peak, in the order they ran.",
             "",
             "| workload | GFLOP required | GEMM peak GFLOP/s (before / after) | system | wall s | achieved GFLOP/s "
             "| share of the roofline | peak beside the run (before / after) | share against it "
             "| every batch's share |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | --- | ---: | --- |"]
    with Engine(model_dir, num_threads=1, video_frames=8) as engine:
        for res in results:
            flops = required_flops(engine, W.scaled(res["workload"], res.get("scale", 1.0)))
            flops.pop("_counts")
            total = sum(flops.values())
            peaks = res.get("gemm_peak_gflops")
            if not peaks:
                lines.append(f"| {res['workload']} | {total / 1e9:.1f} "
                             "| not recorded (rerun workloads.py) | | | | | | | |")
                continue
            for s in res["systems"]:
                achieved = total / s["wall_s"] / 1e9
                name = s["system"] + (f" #{s['repeat']}" if res.get("repeats", 1) > 1 else "")
                beside = s.get("gemm_peak_beside")
                near = (f"{beside[0]:.0f} / {beside[1]:.0f} | {achieved / max(beside):.1%}" if beside
                        else "not recorded | ")
                walls = s.get("batch_walls_s") or [s["wall_s"]]
                each = ", ".join(f"{total / w / 1e9 / max(peaks):.1%}" for w in walls)
                lines.append(f"| {res['workload']} | {total / 1e9:.1f} | {peaks[0]:.0f} / {peaks[1]:.0f} | {name} | "
                             f"{s['wall_s']:.2f} | {achieved:.1f} | {achieved / max(peaks):.1%} | {near} | {each} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None):
    ap = bench_parser(__doc__, out="benchmarks/results/roofline.md")
    ap.add_argument("--workload", default="questions_per_image", choices=list(W.WORKLOADS))
    ap.add_argument("--results", help="a workloads.py --out folder: the roofline share of every system in it")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="with --workload")
    ap.add_argument("--peak-rows", type=int, default=PEAK_ROWS)
    ap.add_argument("--model")
    args = ap.parse_args(argv)
    threads_from(args)
    text = from_results(args) if args.results else one_workload(args)
    write_report(args.out, provenance(argv) + "\n\n" + text)


if __name__ == "__main__":
    main()
