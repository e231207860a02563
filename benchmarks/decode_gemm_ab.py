"""The decode-rows GEMM (kernels/decode_gemm.py) on and off in the engine, alternating: each workload
through a fresh Engine as benchmarks/workloads.py runs it (one batch after a warm-up request), with
CpuLinear's rows for the kernel (vlserve.model.cpu_gemm.decode_gemm_rows) as built, then emptied
(decode_gemm_stream.decode_kernel_off: every row takes the path it would take without the kernel). Best wall time of each side, and the ratio.

    python benchmarks/decode_gemm_ab.py --workloads few_shot,questions_per_image,video_qa --dtypes float32,bfloat16
"""

import argparse
import contextlib

import torch

from vlserve.bench import workloads as W
from vlserve.bench.models import BENCH_SPEC, bench_model
from vlserve.bench.report import write_report
from decode_gemm_stream import decode_kernel_off  # beside this file, as is workloads.py
from workloads import run_vlserve


def wall(model_dir: str, workload: str, dtype: str, threads: int, kernel: bool) -> float:
    with contextlib.nullcontext() if kernel else decode_kernel_off():
        run, _ = run_vlserve("vlserve-lpm", model_dir, W.WORKLOADS[workload](), threads, dtype)
    return run.wall_s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="few_shot,questions_per_image,video_qa")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each side; the order alternates")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/decode_gemm_ab.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = bench_model("/tmp/vlserve-bench-models/bench", BENCH_SPEC)
    lines = [f"The decode-rows GEMM on / off in the engine ({args.threads} threads, CPU capability "
             f"{torch.backends.cpu.get_cpu_capability()}), wall seconds of each run, alternating.", "",
             "| dtype | workload | kernel on | kernel off | off / on (best) |", "| --- | --- | --- | --- | ---: |"]
    for dtype in args.dtypes.split(","):
        for workload in args.workloads.split(","):
            walls = {True: [], False: []}
            for repeat in range(args.repeats):
                for kernel in ((True, False) if repeat % 2 == 0 else (False, True)):
                    walls[kernel].append(wall(model_dir, workload, dtype, args.threads, kernel))
            on, off = (", ".join(f"{w:.3f}" for w in walls[k]) for k in (True, False))
            lines.append(f"| {dtype} | {workload} | {on} | {off} | {min(walls[False]) / min(walls[True]):.2f}x |")
            print(lines[-1], flush=True)
    write_report(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
