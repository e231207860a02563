"""Paged attention kernels: correctness against the references, then speed (on a CUDA GPU).

    python benchmarks/kernels.py [--out benchmarks/results/kernels_gpu.md] [--budget-s 270]

On a GPU: (a) both Triton kernels against the PyTorch references for fp32/fp16/bf16 and head dims
16/32/64/80/96/128; (b) decode (batch 64, context 4096) and extend timed against PyTorch's
scaled_dot_product_attention on gathered (dense) KV and against the reference, with the achieved
bandwidth (bytes of K+V read / time) as a fraction of a device-to-device copy measured in the same
run (copy bandwidth counts bytes read + bytes written); (c) a small sweep of decode launch configs.
Without CUDA it runs only (a), at small sizes, in the Triton interpreter, and says so.
Writes a Markdown report to --out; exits 1 if any correctness check fails.
"""

import argparse
import os
import platform
import statistics
import importlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import vlserve.kernels as K  # noqa: E402
decode_mod = importlib.import_module("vlserve.kernels.decode_attention")  # the module; K.decode_attention is the op
from vlserve.kernels.paged_batch import random_paged_batch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# A CPU run (interpreter, correctness only) never overwrites the GPU report by default.
DEFAULT_OUT = ROOT / "benchmarks" / "results" / ("kernels_gpu.md" if ON_GPU else "kernels_cpu.md")
HEAD_DIMS = (16, 32, 64, 80, 96, 128)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DECODE_TARGET = 0.70

# Timed shapes (GPU only). Decode: batch 64 x context 4096, Llama-3-8B-like GQA and LLaVA-1.5-7B-like MHA.
BENCH_DEVICE = "cuda"
BENCH_HEAD_DIM = 128
DECODE_BATCH, DECODE_CONTEXT = 64, 4096
DECODE_LAYOUTS = ((32, 8, 16), (32, 8, 1), (32, 32, 16))  # (Hq, Hkv, page_size)
EXTEND_HEADS = (32, 8)
EXTEND_SHAPES = ((4, 4096, 1024), (4, 2048, 2048), (16, 1024, 128))  # (batch, seq_len, new tokens)
SWEEP = dict(block_n=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3))


@dataclass
class Report:
    started: float = field(default_factory=time.perf_counter)
    sections: list[str] = field(default_factory=list)
    failures: int = 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def table(self, title: str, header: list[str], rows: list[list], note: str = "") -> None:
        lines = [f"## {title}", ""] + ([note, ""] if note else [])
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        self.sections.append("\n".join(lines))
        print(self.sections[-1] + "\n", flush=True)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


# ------------------------------------------------------------------------------- correctness


def correctness(report: Report, device: str) -> None:
    """Every dtype x head dim for both kernels; the GQA ratio and page size rotate across cases."""
    if ON_GPU:
        decode_lens, splits = [1, 37, 300, 1000, 4097], [None, 7]
        seq_lens, extend_lens = [1, 200, 700, 1500, 2100], [1, 200, 65, 900, 1]
    else:
        decode_lens, splits = [1, 9, 70, 131], [None, 3]
        seq_lens, extend_lens = [1, 20, 70, 90], [1, 20, 5, 66]
    rows = []
    for i, dtype in enumerate(DTYPES):
        for j, head_dim in enumerate(HEAD_DIMS):
            ratio = (1, 2, 4)[(i + j) % 3]
            num_kv_heads = 2
            page_size = (1, 16)[j % 2]
            num_kv_splits = splits[(i + j) % 2]
            shape = f"Hq={ratio * num_kv_heads} Hkv={num_kv_heads} D={head_dim} page={page_size}"
            seed = 10 * i + j
            try:
                batch = random_paged_batch(decode_lens, None, ratio * num_kv_heads, num_kv_heads, head_dim,
                                           dtype, page_size, device, seed=seed)
                err = rel_err(batch.decode(K.decode_attention, num_kv_splits), batch.decode(K.decode_attention_ref))
                rows.append(check_row("decode", dtype, f"{shape} splits={num_kv_splits or 'auto'}", err))
                batch = random_paged_batch(seq_lens, extend_lens, ratio * num_kv_heads, num_kv_heads, head_dim,
                                           dtype, page_size, device, seed=seed)
                err = rel_err(batch.extend(K.extend_attention), batch.extend(K.extend_attention_ref))
                rows.append(check_row("extend", dtype, shape, err))
            except Exception as e:  # a compile error for one shape must not hide the rest
                rows.append(["decode/extend", dtype_name(dtype), shape, "-", "-", f"ERROR {type(e).__name__}: {e}"])
    report.failures += sum(row[-1] != "ok" for row in rows)
    where = ("natively on the GPU" if ON_GPU else
             "in the Triton interpreter on the CPU (no CUDA): small sizes, bf16 through the kernels' "
             "upcast-to-fp32 path (the interpreter cannot run bf16 dots)")
    report.table("Correctness against the PyTorch references", ["kernel", "dtype", "shape", "max rel err",
                                                                 "tolerance", "result"], rows,
                 f"Run {where}. Decode lengths {decode_lens}; extend seq_lens {seq_lens}, extend_lens "
                 f"{extend_lens}. Error = max|out - ref| / max|ref|.")


def check_row(kernel: str, dtype: torch.dtype, shape: str, err: float) -> list:
    ok = err < TOLERANCE[dtype]
    return [kernel, dtype_name(dtype), shape, f"{err:.2e}", f"{TOLERANCE[dtype]:.1e}", "ok" if ok else "FAIL"]


# ------------------------------------------------------------------------------------ timing


def cuda_time_ms(fn, warmup: int = 3, iters: int = 20) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes/s of a device-to-device copy of a 2 GiB buffer (read + write bytes)."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), warmup=2, iters=10)
    return 2 * (2 << 30) / (ms * 1e-3)


def gathered_kv(batch, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, Hkv, num_tokens, D] dense K and V of every request (all requests have num_tokens)."""
    slots = batch.req_to_token[batch.req_pool_indices, :num_tokens].long()
    return (batch.k_buffer[slots].transpose(1, 2).contiguous(), batch.v_buffer[slots].transpose(1, 2).contiguous())


def gathered_sdpa(batch, num_tokens: int, num_new: int):
    """SDPA over pre-gathered dense KV (the gather not timed), and gather + SDPA."""
    q = batch.q.view(-1, num_new, *batch.q.shape[1:]).transpose(1, 2)  # [B, Hq, num_new, D]
    k, v = gathered_kv(batch, num_tokens)
    mask = None
    if num_new > 1:
        mask = torch.ones(num_new, num_tokens, dtype=torch.bool, device=q.device).tril(num_tokens - num_new)

    def dense():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=batch.sm_scale,
                                                                enable_gqa=True)

    def gather_then_dense():
        kk, vv = gathered_kv(batch, num_tokens)
        return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=batch.sm_scale,
                                                                enable_gqa=True)
    return dense, gather_then_dense


def kv_bytes(batch, num_tokens: int) -> int:
    b, kv_heads, head_dim = batch.seq_lens.shape[0], batch.k_buffer.shape[1], batch.k_buffer.shape[2]
    return 2 * b * num_tokens * kv_heads * head_dim * batch.k_buffer.element_size()


def timing(report: Report, copy_bw: float, budget_s: float) -> None:
    batch_size, context, head_dim = DECODE_BATCH, DECODE_CONTEXT, BENCH_HEAD_DIM
    decode_rows, sweep_rows = [], []
    for dtype in (torch.float16, torch.bfloat16):
        for layout in DECODE_LAYOUTS:
            num_q_heads, num_kv_heads, page_size = layout
            label = ["decode", dtype_name(dtype), f"Hq={num_q_heads} Hkv={num_kv_heads}", page_size]
            if report.elapsed() > budget_s:
                decode_rows.append(label + ["skipped: time budget"] + [""] * 6)
                continue
            try:
                row, sweep = time_decode(dtype, num_q_heads, num_kv_heads, page_size, copy_bw, report, budget_s,
                                         sweep=layout == DECODE_LAYOUTS[0])
                decode_rows.append(label + row)
                sweep_rows += sweep
            except Exception as e:  # one failing shape (OOM, compile error) must not hide the rest
                decode_rows.append(label + [f"ERROR {type(e).__name__}: {str(e)[:100]}"] + [""] * 6)
            torch.cuda.empty_cache()
    report.table(
        f"Decode: batch {batch_size}, context {context}, head_dim {head_dim}",
        ["kernel", "dtype", "heads", "page", "triton ms", "GB/s (K+V)", "of copy bw", "SDPA dense ms",
         "gather+SDPA ms", "reference ms", "rel err vs ref"], decode_rows,
        f"Device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write). Triton timed through the public "
        f"decode_attention (num_kv_splits=None: one host sync for the max length). SDPA dense: "
        f"scaled_dot_product_attention on KV gathered beforehand into [B, Hkv, L, D]; gather+SDPA includes "
        f"the gather. Reference: decode_attention_ref (one SDPA per request).")
    if sweep_rows:
        report.table(f"Decode launch-config sweep (Hq, Hkv, page = {DECODE_LAYOUTS[0]})",
                     ["dtype", "block_n", "num_warps", "num_stages", "num_kv_splits", "ms", "of copy bw"],
                     sweep_rows, f"Defaults: {decode_mod.DecodeConfig()} with "
                                 f"num_kv_splits from choose_num_kv_splits.")
    extend_timing(report, copy_bw, budget_s)


def time_decode(dtype, num_q_heads, num_kv_heads, page_size, copy_bw, report, budget_s, sweep: bool):
    context = DECODE_CONTEXT
    batch = random_paged_batch([context] * DECODE_BATCH, None, num_q_heads, num_kv_heads, BENCH_HEAD_DIM, dtype,
                               page_size, BENCH_DEVICE, seed=1)
    nbytes = kv_bytes(batch, context)
    o, o_ref = torch.empty_like(batch.q), torch.empty_like(batch.q)
    args = (batch.q, batch.k_buffer, batch.v_buffer, o, batch.req_to_token, batch.req_pool_indices,
            batch.seq_lens, batch.sm_scale)
    ms = cuda_time_ms(lambda: K.decode_attention(*args))
    dense, gather_dense = gathered_sdpa(batch, context, 1)
    dense_ms, gather_ms = cuda_time_ms(dense), cuda_time_ms(gather_dense)
    ref_ms = cuda_time_ms(lambda: K.decode_attention_ref(*args[:3], o_ref, *args[4:]), warmup=1, iters=3)
    err = rel_err(o, o_ref)
    report.failures += err >= TOLERANCE[dtype]
    fraction = nbytes / (ms * 1e-3) / copy_bw
    status = "meets" if fraction >= DECODE_TARGET else "below"
    row = [f"{ms:.3f}", f"{nbytes / (ms * 1e-3) / 1e9:.0f}", f"{fraction:.0%} ({status} {DECODE_TARGET:.0%})",
           f"{dense_ms:.3f}", f"{gather_ms:.3f}", f"{ref_ms:.1f}", f"{err:.1e}"]
    return row, decode_sweep(batch, args, nbytes, copy_bw, report, budget_s) if sweep else []


def decode_sweep(batch, args, nbytes, copy_bw, report, budget_s) -> list[list]:
    auto = decode_mod.choose_num_kv_splits(int(batch.seq_lens.max()), batch.q.shape[0], batch.k_buffer.shape[1],
                                           batch.q.device)
    rows = []
    for block_n in SWEEP["block_n"]:
        for num_warps in SWEEP["num_warps"]:
            for num_stages in SWEEP["num_stages"]:
                for splits in sorted({auto, 2 * auto, 4 * auto}):
                    if report.elapsed() > budget_s:
                        return rows
                    config = decode_mod.DecodeConfig(block_n, num_warps, num_stages)
                    try:
                        ms = cuda_time_ms(lambda: decode_mod.launch_decode(*args, splits, config), iters=10)
                        rows.append([dtype_name(batch.q.dtype), block_n, num_warps, num_stages, splits,
                                     f"{ms:.3f}", f"{nbytes / (ms * 1e-3) / copy_bw:.0%}"])
                    except Exception as e:
                        rows.append([dtype_name(batch.q.dtype), block_n, num_warps, num_stages, splits,
                                     f"ERROR {type(e).__name__}", str(e)[:80]])
    return rows


def extend_timing(report: Report, copy_bw: float, budget_s: float) -> None:
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for batch_size, seq_len, num_new in EXTEND_SHAPES:
            label = ["extend", dtype_name(dtype), f"B={batch_size} seq={seq_len} new={num_new}"]
            if report.elapsed() > budget_s:
                rows.append(label + ["skipped: time budget"] + [""] * 6)
                continue
            try:
                rows.append(label + time_extend(dtype, batch_size, seq_len, num_new, copy_bw, report))
            except Exception as e:
                rows.append(label + [f"ERROR {type(e).__name__}: {str(e)[:100]}"] + [""] * 6)
            torch.cuda.empty_cache()
    num_q_heads, num_kv_heads = EXTEND_HEADS
    report.table(f"Extend: Hq={num_q_heads} Hkv={num_kv_heads} head_dim={BENCH_HEAD_DIM}, page 16",
                 ["kernel", "dtype", "shape", "triton ms", "TFLOP/s", "K+V bw of copy", "SDPA dense ms",
                  "gather+SDPA ms", "reference ms", "rel err vs ref"], rows,
                 "New tokens attend to the cached prefix and causally to themselves; SDPA dense uses an explicit "
                 "bottom-right causal mask over gathered KV. TFLOP/s counts only visible (unmasked) scores.")


def time_extend(dtype, batch_size, seq_len, num_new, copy_bw, report) -> list:
    head_dim, (num_q_heads, num_kv_heads) = BENCH_HEAD_DIM, EXTEND_HEADS
    batch = random_paged_batch([seq_len] * batch_size, [num_new] * batch_size, num_q_heads, num_kv_heads,
                               head_dim, dtype, 16, BENCH_DEVICE, seed=2)
    o = torch.empty_like(batch.q)
    ms = cuda_time_ms(lambda: K.extend_attention(
        batch.q, batch.k_buffer, batch.v_buffer, o, batch.req_to_token, batch.req_pool_indices,
        batch.seq_lens, batch.extend_lens, batch.qo_start_loc, batch.sm_scale))
    dense, gather_dense = gathered_sdpa(batch, seq_len, num_new)
    dense_ms, gather_ms = cuda_time_ms(dense), cuda_time_ms(gather_dense)
    ref_ms = cuda_time_ms(lambda: batch.extend(K.extend_attention_ref), warmup=1, iters=3)
    err = rel_err(o, batch.extend(K.extend_attention_ref))
    report.failures += err >= TOLERANCE[dtype]
    prefix = seq_len - num_new
    visible_keys = num_new * prefix + num_new * (num_new + 1) // 2
    flops = 4 * batch_size * num_q_heads * head_dim * visible_keys
    nbytes = kv_bytes(batch, seq_len)
    return [f"{ms:.3f}", f"{flops / (ms * 1e-3) / 1e12:.0f}", f"{nbytes / (ms * 1e-3) / copy_bw:.0%}",
            f"{dense_ms:.3f}", f"{gather_ms:.3f}", f"{ref_ms:.1f}", f"{err:.1e}"]


def shown_path(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--budget-s", type=float, default=270.0,
                        help="skip remaining timings after this many seconds (the whole run must stay < 5 min)")
    args = parser.parse_args()
    torch.manual_seed(0)
    import triton

    report = Report()
    device = "cuda" if ON_GPU else "cpu"
    where = torch.cuda.get_device_name() if ON_GPU else f"CPU only ({platform.processor() or platform.machine()})"
    header = [f"# Paged attention kernels — {where}", "",
              f"torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}."]
    if not ON_GPU:
        header += ["", "**No CUDA device: correctness only, in the Triton interpreter (TRITON_INTERPRET=1), at small "
                       "sizes. No timings.**"]
    print("\n".join(header) + "\n", flush=True)

    correctness(report, device)
    if ON_GPU:
        bw = copy_bandwidth()
        print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
        timing(report, bw, args.budget_s)
    footer = (f"Finished in {report.elapsed():.0f} s; {report.failures} correctness failure(s). "
              f"Command: `python benchmarks/kernels.py --out {shown_path(args.out)}`.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n\n".join(["\n".join(header)] + report.sections + [footer]) + "\n")
    print(footer)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
