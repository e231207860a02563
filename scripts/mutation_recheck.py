"""Reruns a mutmut run's surviving mutants against tests written after it (scripts/mutation.sh with
MUTATION_RECHECK): each survivor runs the new tests with its mutation switched on, and a failing test
turns it into a kill in the run's records. The verdicts of the run itself are kept once, in
before.json, for the report's "before" table.

    python scripts/mutation_recheck.py STAGE "TESTS" MODULE.py...

Only the new tests run: the run's own tests already passed with these mutants.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from mutation_report import staged, status

KILLED, TIMEOUT = 1, 36  # mutmut's exit codes for a failing test and a hung one
PER_MUTANT_S = 600


def pytest(stage: Path, tests: list[str], mutant: str) -> int:
    """pytest's exit code for the tests with this mutant on ("" = the original code). The venv's pytest
    script, not `python -m pytest`, so the staged original vlserve/ is not put first on sys.path."""
    env = dict(os.environ, MUTANT_UNDER_TEST=mutant, PYTHONPATH=str(stage / "mutants"))
    cmd = [str(Path(sys.executable).with_name("pytest")), "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
           *tests]
    try:
        return subprocess.run(cmd, cwd=stage, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=PER_MUTANT_S).returncode
    except subprocess.TimeoutExpired:
        return TIMEOUT


def main() -> None:
    stage, tests, modules = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
    if pytest(stage, tests, "") != 0:  # a test that fails on the original code kills nothing
        sys.exit(f"the tests {tests} fail on the unmutated code in {stage}")
    before_path = stage / "before.json"
    metas = {m: stage / "mutants" / (staged(m) + ".meta") for m in modules}
    if not before_path.exists():
        before = {m: json.loads(p.read_text())["exit_code_by_key"] for m, p in metas.items()}
        before_path.write_text(json.dumps(before))
    for module, path in metas.items():
        meta = json.loads(path.read_text())
        codes = meta["exit_code_by_key"]
        for key, code in codes.items():
            if status(code) not in ("survived", "no tests", "suspicious"):
                continue
            result = pytest(stage, tests, key)
            if result == TIMEOUT or result == 1:
                codes[key] = result
            elif result != 0:
                sys.exit(f"pytest ended with {result} on {key}: run it by hand in {stage}")
            print(f"{key}: {'killed' if codes[key] != code else 'survives'}", file=sys.stderr)
        path.write_text(json.dumps(meta))


if __name__ == "__main__":
    main()
