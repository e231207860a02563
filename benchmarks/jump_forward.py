"""Jump-forward on vs off, JSON decoding with a schema of long constant keys (the paper's JSON workload).

    .venv/bin/python benchmarks/jump_forward.py [--model DIR] [--requests 16] [--out benchmarks/results/jump_forward.md]

Both runs use the same engine settings, prompts and greedy sampling, in one process. Reports forward
passes per output (decode-only passes, and all passes: a jump is computed in one extend pass),
output tokens, wall time and throughput. Without --model it uses a small random LLaVA
(vlserve.bench.models.SMALL_SPEC): what is measured is the number of forward passes, which the
compressed FSM decides, not the model's quality.
"""

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time

import torch

from vlserve.bench.report import write_report

SCHEMA = {
    "type": "object",
    "properties": {
        "name_of_the_main_character_in_the_picture": {"type": "string", "maxLength": 8},
        "the_colour_of_the_largest_shape_in_the_picture": {"enum": ["red", "green", "blue", "yellow"]},
        "number_of_distinct_shapes_visible_in_the_picture": {"enum": [0, 1, 2, 3]},
        "is_the_background_of_the_picture_plain_or_textured": {"enum": ["plain", "textured"]},
        "a_short_description_of_the_scene_as_a_whole": {"type": "string", "maxLength": 12},
    },
    "required": ["name_of_the_main_character_in_the_picture", "the_colour_of_the_largest_shape_in_the_picture",
                 "number_of_distinct_shapes_visible_in_the_picture",
                 "is_the_background_of_the_picture_plain_or_textured",
                 "a_short_description_of_the_scene_as_a_whole"],
}


def run(model: str, jump: bool, n: int) -> dict:
    from vlserve import Engine

    schema = SCHEMA
    with Engine(model, max_total_tokens=16384, disable_jump_forward=not jump) as engine:
        prompts = [f"USER: Describe picture number {i} as JSON. ASSISTANT:" for i in range(n)]
        params = {"max_new_tokens": 400, "temperature": 0, "json_schema": json.dumps(schema)}
        engine.generate(prompt=prompts[:1], sampling_params=params)  # compile the constraint once
        m = engine.metrics
        before = {mode: m.value(m.forward_passes, mode=mode) for mode in ("prefill", "decode")}
        start = time.perf_counter()
        outs = engine.generate(prompt=prompts, sampling_params=params)
        wall = time.perf_counter() - start
        passes = {mode: m.value(m.forward_passes, mode=mode) - before[mode] for mode in before}
    for o in outs:
        if o["meta_info"]["finish_reason"] != "stop" or not _is_json(o["text"]):
            raise AssertionError(f"not a finished JSON output: {o}")
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"jump": jump, "outputs": n, "tokens": tokens, "wall_s": wall,
            "decode_passes": passes["decode"], "all_passes": passes["decode"] + passes["prefill"],
            "req_per_s": n / wall, "chars": sum(len(o["text"]) for o in outs)}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/jump_forward.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = args.model
    if model is None:
        from vlserve.bench.models import SMALL_SPEC, bench_model
        model = bench_model(os.path.join(tempfile.gettempdir(), "vlserve-bench-small"), SMALL_SPEC)
    off, on = run(model, False, args.requests), run(model, True, args.requests)
    ratio_decode = off["decode_passes"] / max(1, on["decode_passes"])
    ratio_all = off["all_passes"] / max(1, on["all_passes"])
    command = " ".join([os.path.basename(sys.executable), "benchmarks/jump_forward.py"] + (argv or sys.argv[1:]))
    lines = [
        "# Jump-forward decoding (compressed FSM) on vs off",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch threads {args.threads}; "
        f"date {datetime.date.today()}; model {os.path.basename(model.rstrip('/'))}  ",
        f"Workload: {args.requests} greedy requests, JSON schema with five long constant keys "
        "(enum and length-bounded string values, so a random model's output ends).",
        "",
        "| jump-forward | outputs | output tokens | decode passes | all passes | passes/output | wall s | req/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in (off, on):
        lines.append(f"| {'on' if r['jump'] else 'off'} | {r['outputs']} | {r['tokens']} | {r['decode_passes']:.0f} | "
                     f"{r['all_passes']:.0f} | {r['all_passes'] / r['outputs']:.1f} | {r['wall_s']:.2f} "
                     f"| {r['req_per_s']:.2f} |")
    lines += ["", f"Decode passes: {ratio_decode:.2f}x fewer with jump-forward; all forward passes: "
              f"{ratio_all:.2f}x fewer; throughput {on['req_per_s'] / off['req_per_s']:.2f}x "
              "(target: at least 2x fewer decode passes; the paper reports 1.6x throughput)."]
    text = "\n".join(lines) + "\n"
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
