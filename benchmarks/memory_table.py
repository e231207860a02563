"""The memory a served model of N parameters needs, in fp32 and bf16, measured: a real `vlserve serve`
on random checkpoints written by the project's tiny writer (LLaVA: a Llama decoder of the given
hidden sizes and layers, a small CLIP tower; or a real size of vlserve/bench/models.py named by its
spec, e.g. qwen2-0.5b-siglip, under /tmp/vlserve-bench-models), after one answered request: the process's own
resident memory (RssAnon + RssShmem from /proc; the shared libraries' code pages left out, as in
tests/test_memory_budget.py) and the start-up report's weights and KV pool (/get_server_info).

    python benchmarks/memory_table.py --out benchmarks/results/memory_table.md
    python benchmarks/memory_table.py --sizes qwen2-0.5b-siglip --out benchmarks/results/memory_table_0.5b.md
"""

import argparse
import os
import subprocess
import sys

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from helpers.server_helpers import serve_builtin, stop_process  # noqa: E402

from vlserve.bench.models import SPECS, bench_model  # noqa: E402
from vlserve.bench.report import write_report  # noqa: E402

SIZES = {"27M": (512, 2048, 6), "100M": (1024, 4096, 6), "200M": (1024, 4096, 12)}  # hidden, intermediate, layers


def checkpoint(root: str, name: str) -> str:
    if name in SPECS:  # a benchmark checkpoint, shared with the other benchmarks
        return bench_model(os.path.join(os.path.dirname(root), name), SPECS[name])
    hidden, intermediate, layers = SIZES[name]
    path = os.path.join(root, name)
    if not os.path.exists(os.path.join(path, "config.json")):
        spec = (f"TinyModelSpec(vocab_size=4000, hidden_size={hidden}, intermediate_size={intermediate}, "
                f"num_layers={layers}, num_heads={hidden // 64}, num_kv_heads={hidden // 256}, vision_hidden=64, "
                f"vision_layers=1, image_size=32, patch_size=8, max_position_embeddings=4096)")
        script = ("from vlserve.testing.tiny import TinyModelSpec, make_tiny_model; "
                  f"make_tiny_model({path!r}, spec={spec})")
        subprocess.run(["nice", "-n", "19", sys.executable, "-c", script], check=True)
    return path


def measure(path: str, dtype: str, pool: int) -> dict:
    proc, url = serve_builtin("--model", path, "--dtype", dtype, "--max-total-tokens", str(pool),
                              "--chunked-prefill-size", "512")
    try:
        httpx.post(url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 8}}, timeout=300)
        usage = httpx.get(url + "/get_server_info", timeout=30).json()["internal_states"][0]["memory_usage"]
        with open(f"/proc/{proc.pid}/status") as f:
            status = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f) if k.startswith("Rss")}
    finally:
        stop_process(proc)
    return {"usage": usage, "owned": status["RssAnon"] + status["RssShmem"], "file": status["RssFile"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="27M,100M,200M", help=f"of {', '.join(SIZES)} or a spec: {', '.join(SPECS)}")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--pool", type=int, default=2048, help="KV pool tokens")
    ap.add_argument("--root", default="/tmp/vlserve-bench-models/memory-table")
    ap.add_argument("--out", default="benchmarks/results/memory_table.md")
    args = ap.parse_args()
    lines = [f"Served memory by parameters and dtype (KV pool {args.pool} tokens, chunked prefill 512).\n",
             "| checkpoint | parameters | dtype | weights MB | KV pool MB | process MB (own) | "
             "process MB minus weights and pool | shared code MB | bound MB (1.1 x weights + pool + 400) |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in args.sizes.split(","):
        path = checkpoint(args.root, name)
        for dtype in args.dtypes.split(","):
            element = {"float32": 4, "bfloat16": 2}[dtype]
            m = measure(path, dtype, args.pool)
            b = m["usage"]["bytes"]
            params = b["weights"] / element
            lines.append(f"| {name} | {params / 1e6:.0f} M | {dtype} | {b['weights'] / 1e6:.0f} "
                         f"| {b['kv_pool'] / 1e6:.0f} | {m['owned'] / 1e6:.0f} "
                         f"| {(m['owned'] - b['weights'] - b['kv_pool']) / 1e6:.0f} "
                         f"| {m['file'] / 1e6:.0f} | {(1.1 * b['weights'] + b['kv_pool'] + 400e6) / 1e6:.0f} |")
            print(lines[-1], flush=True)
    write_report(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
