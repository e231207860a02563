"""The decode-rows GEMM's tuning constants on this CPU: kernels/csrc/decode_gemm_cpu.cpp built as it
is and once per alternative (each its own extension, its constants substituted in the source),
timed interleaved in one process on the decode step's streamed weights (the benchmark model's eight
layers, each with its own weights), best of --repeats per round, the best round kept. Interleaving
is what makes a few percent visible on a shared host: builds timed in separate processes minutes
apart moved by more than that (benchmarks/decode_gemm_stream.py before/after).

An alternative is `name=CHUNK:WHOLE`: kChunkSteps (steps of K per chunk; a bf16 step is a pair of
K) and kWholeChunkFetchPasses (up to this many row passes a chunk, its first pass fetches the whole
next chunk). AVX-512 only (the AVX2 build has constants of its own).

    python benchmarks/decode_gemm_constants.py --variants old=128:4 --rows 8,12,16,24,32,64 --dtype bfloat16
    python benchmarks/decode_gemm_constants.py --variants old=128:4,c512=512:2 --dtype float32 --out benchmarks/results/decode_gemm_constants.md
"""

import argparse
import os
import re
import shutil
import tempfile

import torch

from vlserve.bench.report import write_report
from vlserve.bench.timing import best_ms
from decode_gemm_stream import LAYERS, SHAPES  # beside this file: the decode step it times

SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "csrc")
CONSTANTS = {"chunk": r"(constexpr int64_t kChunkSteps = )(\d+)(;)",
             "whole": r"(#if VLSERVE_DECODE_GEMM == 512\nconstexpr int64_t kWholeChunkFetchPasses = )(\d+)(;)"}


def variant_source(source: str, library: str, chunk: int | None = None, whole: int | None = None) -> str:
    """The kernel's source with its op library renamed (so builds load side by side) and the AVX-512
    constants replaced; raises if a constant is not where this script expects it."""
    for key, value in (("chunk", chunk), ("whole", whole)):
        if value is None:
            continue
        source, n = re.subn(CONSTANTS[key], rf"\g<1>{value}\g<3>", source, count=1)
        if n != 1:
            raise SystemExit(f"decode_gemm_cpu.cpp has no {key} constant where {CONSTANTS[key]!r} expects it")
    return source.replace("vlserve_decode_gemm", library)


def build(name: str, source: str, workdir: str):
    from torch.utils.cpp_extension import load

    where = os.path.join(workdir, name)
    os.makedirs(where, exist_ok=True)
    for header in ("vec_cpu.h", "amx_cpu.h"):
        shutil.copy(os.path.join(SOURCE_DIR, header), where)
    path = os.path.join(where, "decode_gemm.cpp")
    with open(path, "w") as f:
        f.write(source)
    load(name=f"dgc_{name}", sources=[path], extra_cflags=["-O3", "-march=native", "-fopenmp"],
         extra_ldflags=["-fopenmp"], is_python_module=False, build_directory=where)
    return getattr(torch.ops, f"dgc_{name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", required=True, help="comma-separated name=CHUNK:WHOLE")
    ap.add_argument("--rows", default="8,12,16,24,32,64")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    with open(os.path.join(SOURCE_DIR, "decode_gemm_cpu.cpp")) as f:
        source = f.read()
    variants = {"current": {}}
    for spec in args.variants.split(","):
        name, _, values = spec.partition("=")
        chunk, _, whole = values.partition(":")
        variants[name] = {"chunk": int(chunk), "whole": int(whole) if whole else None}
    with tempfile.TemporaryDirectory(prefix="decode-gemm-constants-") as workdir:
        ops = {name: build(name, variant_source(source, f"dgc_{name}", **consts), workdir)
               for name, consts in variants.items()}
    if ops["current"].vector_bits() != 512:
        raise SystemExit("the constants this script changes are the AVX-512 build's; this CPU builds "
                         f"{ops['current'].vector_bits()}-bit vectors")
    weights = [[torch.randn(n, k).to(dtype) for n, k in SHAPES] for _ in range(LAYERS)]
    packed = {name: [[op.pack_weight(w) for w in layer] for layer in weights] for name, op in ops.items()}
    lines = [f"Decode-rows GEMM constants, {args.dtype}, {args.threads} threads, the benchmark model's {LAYERS} "
             f"layers' weights streamed; GFLOP/s over the four linears, best of {args.repeats} per round, best of "
             f"{args.rounds} interleaved rounds. Variants: " + ", ".join(f"{n} {c or '(as built)'}" for n, c in variants.items()),
             "", "| rows | " + " | ".join(variants) + " |", "| ---: |" + " ---: |" * len(variants)]
    for rows in map(int, args.rows.split(",")):
        x = {k: torch.randn(rows, k).to(dtype) for _, k in SHAPES}
        flops = 2 * rows * sum(n * k for n, k in SHAPES) * LAYERS
        best = {name: float("inf") for name in ops}
        for _ in range(args.rounds):
            for name, op in ops.items():
                def step():
                    for layer in packed[name]:
                        for (n, k), w in zip(SHAPES, layer):
                            op.linear(x[k], w, n, None)

                with torch.inference_mode():
                    best[name] = min(best[name], best_ms(step, args.repeats))
        lines.append(f"| {rows} | " + " | ".join(f"{flops / best[n] / 1e6:.0f}" for n in ops) + " |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        write_report(args.out, text)
    else:
        print(text)


if __name__ == "__main__":
    main()
