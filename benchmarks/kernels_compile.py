"""Compile the Triton attention kernels for an NVIDIA GPU without one, and report their resources.

    python benchmarks/kernels_compile.py [--arch 90] [--dtypes float16 ...] [--head-dims 128 ...] [--sweep]

Runs Triton's full pipeline (TTIR -> TTGIR -> PTX -> cubin through the ptxas bundled with triton) for
every dtype x head dim with the default launch configs (and, with --sweep, the decode configs that
benchmarks/kernels.py sweeps), then prints shared memory, registers and spills per kernel. It catches
what the interpreter cannot: GPU-only compile errors, shared memory over the limit, register spills.
Argument specialisation mirrors a real launch on the KV pool: unit strides along head_dim and
req_to_token rows are constants, other strides and the pointers are multiples of 16.
Exits 1 if any kernel fails to compile or needs more shared memory than an SM has.
"""

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported: compile, do not interpret

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

decode_mod = importlib.import_module("vlserve.kernels.decode_attention")  # modules: the package's
extend_mod = importlib.import_module("vlserve.kernels.extend_attention")  # attributes of these names are the ops
launch_mod = importlib.import_module("vlserve.kernels.launch")

MAX_SHARED_BYTES = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
UNIT_STRIDES = {"stride_qd", "stride_kd", "stride_vd", "stride_od", "stride_rp"}
DIV16_ARGS = {"stride_qb", "stride_qt", "stride_qh", "stride_ks", "stride_kh", "stride_vs", "stride_vh",
              "stride_ob", "stride_ot", "stride_oh", "stride_pb", "stride_ph", "stride_ps"}
INDEX_POINTERS = {"ReqToToken": "*i32", "ReqPoolIndices": "*i64", "SeqLens": "*i32", "ExtendLens": "*i32",
                  "QoStartLoc": "*i32", "PartialOut": "*fp32", "PartialLse": "*fp32"}
TRITON_TYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def compile_kernel(fn, dtype: torch.dtype, constexprs: dict, num_warps: int, num_stages: int, arch: int):
    constexprs = dict(constexprs, **{name: 1 for name in fn.arg_names if name in UNIT_STRIDES})
    pointers = dict(INDEX_POINTERS, **{name: "*" + TRITON_TYPE[dtype] for name in ("Q", "K", "V", "Out")})
    scalar_type = {name: "fp32" if name == "qk_scale" else "i32" for name in fn.arg_names}
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, scalar_type[name])
                 for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name in DIV16_ARGS or name in pointers}
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def ptxas_usage(ptx: str, arch: int) -> tuple[int, int]:
    """(registers per thread, spill store bytes) from ptxas -v."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        Path(path).write_text(ptx)
        suffix = "a" if arch >= 90 else ""
        result = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}{suffix}", path, "-o",
                                 os.path.join(tmp, "kernel.cubin")], capture_output=True, text=True, check=True)
    registers = re.search(r"Used (\d+) registers", result.stderr)
    spills = re.search(r"(\d+) bytes spill stores", result.stderr)
    return int(registers.group(1)) if registers else -1, int(spills.group(1)) if spills else 0


def specializations(dtypes, head_dims, sweep: bool):
    """(label, kernel, dtype, head_dim, constexprs, num_warps, num_stages) for every launch to check."""
    for dtype in dtypes:
        upcast, precision = launch_mod.dot_operands(dtype)
        dot = {"UPCAST": upcast, "DOT_PRECISION": precision}
        for head_dim in head_dims:
            block_d = launch_mod.padded_head_dim(head_dim)
            shape = {"HEAD_DIM": head_dim, "BLOCK_D": block_d}
            decode_configs = [decode_mod.default_decode_config(dtype)]
            if sweep and dtype != torch.float32:
                decode_configs += [decode_mod.DecodeConfig(n, w, s) for n in (32, 64, 128) for w in (4, 8)
                                   for s in (2, 3)]
            for config in dict.fromkeys(decode_configs):
                yield (f"decode split {config}", decode_mod._decode_split_kernel, dtype, head_dim,
                       dict(shape, **dot, GROUP=4, BLOCK_H=16, BLOCK_N=config.block_n), config.num_warps,
                       config.num_stages)
            yield ("decode merge", decode_mod._decode_merge_kernel, dtype, head_dim, shape, 2, 2)
            config = extend_mod.default_extend_config(dtype)
            yield (f"extend {config}", extend_mod._extend_kernel, dtype, head_dim,
                   dict(shape, **dot, GROUP=4, BLOCK_M=config.block_m, BLOCK_N=config.block_n), config.num_warps,
                   config.num_stages)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80 or 90")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[16, 32, 64, 80, 96, 128])
    parser.add_argument("--sweep", action="store_true", help="also the decode configs benchmarks/kernels.py sweeps")
    args = parser.parse_args()
    dtypes = [getattr(torch, name) for name in args.dtypes]
    limit = MAX_SHARED_BYTES.get(args.arch, 99 * 1024)

    print(f"triton {triton.__version__}, target sm_{args.arch}, shared memory limit {limit} bytes\n")
    print("| kernel | dtype | head_dim | warps | stages | shared bytes | registers | spill bytes | result |")
    print("|---|---|---|---|---|---|---|---|---|")
    failures = 0
    for label, fn, dtype, head_dim, constexprs, num_warps, num_stages in specializations(dtypes, args.head_dims,
                                                                                          args.sweep):
        start = time.perf_counter()
        try:
            compiled = compile_kernel(fn, dtype, constexprs, num_warps, num_stages, args.arch)
            registers, spills = ptxas_usage(compiled.asm["ptx"], args.arch)
            shared = compiled.metadata.shared
            result = "ok" if shared <= limit else "FAIL: shared memory over the limit"
            if spills and shared <= limit:
                result = "ok (spills)"
        except Exception as e:  # report every specialisation, then fail
            shared = registers = spills = "-"
            result = f"FAIL: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        failures += result.startswith("FAIL")
        print(f"| {label} | {str(dtype)[6:]} | {head_dim} | {num_warps} | {num_stages} | {shared} | {registers} "
              f"| {spills} | {result} ({time.perf_counter() - start:.1f} s) |", flush=True)
    print(f"\n{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
