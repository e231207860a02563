"""tests/test_schemathesis.py with other seeds and 10x the examples: Schemathesis over every route of
a real `vlserve serve`, failing on any 5xx, any response the schema does not describe, an unhealthy
server or KV left in use afterwards.

    python benchmarks/fuzz_schemathesis.py                 # seeds 1 2 3, 10x the suite's examples
    python benchmarks/fuzz_schemathesis.py --seeds 7 --scale 2

One pytest run per seed (each its own server); writes benchmarks/results/fuzz_schemathesis.md with
each run's outcome, wall time and the failures pytest reported.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST = os.path.join(ROOT, "tests", "test_schemathesis.py")


def suite_examples() -> int:
    with open(TEST) as f:
        return int(re.search(r'VLSERVE_FUZZ_EXAMPLES", "(\d+)"', f.read()).group(1))


def run(seed: int, examples: int) -> dict:
    env = {**os.environ, "VLSERVE_FUZZ_SEED": str(seed), "VLSERVE_FUZZ_EXAMPLES": str(examples)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", TEST],
                          cwd=os.path.join(ROOT, "tests"), env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    summary = next((line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed|error)", line)), "")
    failures = re.findall(r"^(?:FAILED|ERROR) .*$", out, re.M)
    details = re.findall(r"^\s*\|?\s*- (ST\d+ .*)$", out, re.M)  # Schemathesis's failure titles
    return {"seed": seed, "rc": proc.returncode, "wall_s": time.perf_counter() - start, "summary": summary,
            "failures": failures, "details": sorted(set(details)), "tail": out[-3000:] if proc.returncode else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--scale", type=int, default=10, help="examples per operation: this times the suite's")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "fuzz_schemathesis.md"))
    args = parser.parse_args()
    examples = suite_examples() * args.scale
    runs = [run(seed, examples) for seed in args.seeds]
    lines = ["# Schemathesis fuzzing at 10x the suite's examples", "",
             f"- command: `python benchmarks/fuzz_schemathesis.py --seeds {' '.join(map(str, args.seeds))} "
             f"--scale {args.scale}`",
             f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
             f"- machine: {platform.node()} ({platform.platform()}), {os.cpu_count()} CPUs",
             f"- examples per operation and generation mode: {examples} (the suite: {suite_examples()})", "",
             "| seed | result | wall |", "| --- | --- | --- |"]
    lines += [f"| {r['seed']} | {'pass' if r['rc'] == 0 else 'FAIL'}: {r['summary'].strip('= ')} "
              f"| {r['wall_s']:.0f} s |"
              for r in runs]
    for r in runs:
        if r["rc"]:
            lines += ["", f"## seed {r['seed']}: failures", "", *[f"- {f}" for f in r["failures"] + r["details"]],
                      "", "```", r["tail"], "```"]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
