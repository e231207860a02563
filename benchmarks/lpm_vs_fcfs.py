"""lpm vs fcfs on few-shot alone, alternating, on the benchmark model (a quick check of scheduling cost).

    python benchmarks/lpm_vs_fcfs.py
"""

import os
import tempfile
import time, torch
torch.set_num_threads(2)
from vlserve import Engine
from vlserve.bench.models import bench_model
from vlserve.bench import workloads as W
reqs = W.few_shot()
MODEL = bench_model(os.path.join(tempfile.gettempdir(), "vlserve-bench-models", "bench"))
for policy in ("lpm", "fcfs", "lpm", "fcfs"):
    with Engine(MODEL, schedule_policy=policy, max_total_tokens=65536) as e:
        e.generate(prompt="USER: warm up ASSISTANT:", sampling_params={"max_new_tokens": 2})
        t = time.perf_counter()
        outs = e.generate(prompt=[r.prompt for r in reqs], sampling_params={"max_new_tokens": 16, "temperature": 0, "ignore_eos": True})
        dt = time.perf_counter() - t
        m = e.metrics
        print(policy, f"{len(reqs)/dt:.2f} req/s", "passes", {k: m.value(m.forward_passes, mode=k) for k in ("prefill", "decode")}, "cached", sum(o["meta_info"]["cached_tokens"] for o in outs))
