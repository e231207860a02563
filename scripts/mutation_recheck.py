"""Reruns a mutmut run's surviving mutants against tests written after it (scripts/mutation.sh with
MUTATION_RECHECK): each survivor runs the new tests with its mutation switched on, and a failing test
turns it into a kill in the run's records. The verdicts of the run itself are kept once, in
before.json, for the report's "before" table.

    python scripts/mutation_recheck.py STAGE "TESTS" MODULE.py...

A survivor runs only the new tests (the run's own already passed with it). With
MUTATION_RECHECK_UNREACHED=1, mutants the run did not reach run the run's tests too (STAGE/tests.txt),
so they end checked.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mutation_report import staged, status

TIMEOUT = 36  # mutmut's exit code for a mutant that hung the tests
UNREACHED_TIMEOUT_S = 900  # a mutant that runs the run's own tests too


def pytest(stage: Path, tests: list[str], mutant: str, timeout: float) -> int:
    """pytest's exit code for the tests with this mutant on ("" = the original code). The venv's pytest
    script, not `python -m pytest`, so the staged original vlserve/ is not put first on sys.path."""
    env = dict(os.environ, MUTANT_UNDER_TEST=mutant, PYTHONPATH=str(stage / "mutants"))
    cmd = [str(Path(sys.executable).with_name("pytest")), "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
           *tests]
    try:
        return subprocess.run(cmd, cwd=stage, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return TIMEOUT


def main() -> None:
    stage, tests, modules = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
    run_tests = (stage / "tests.txt").read_text().split()
    started = time.monotonic()
    if pytest(stage, tests, "", UNREACHED_TIMEOUT_S) != 0:  # a test that fails on the original code kills nothing
        sys.exit(f"the tests {tests} fail on the unmutated code in {stage}")
    timeout = max(120.0, 10 * (time.monotonic() - started))  # a mutant that loops forever is a kill
    before_path = stage / "before.json"
    metas = {m: stage / "mutants" / (staged(m) + ".meta") for m in modules}
    if not before_path.exists():
        before = {m: json.loads(p.read_text())["exit_code_by_key"] for m, p in metas.items()}
        before_path.write_text(json.dumps(before))
    for module, path in metas.items():
        meta = json.loads(path.read_text())
        codes = meta["exit_code_by_key"]
        for key, code in codes.items():
            unreached = os.environ.get("MUTATION_RECHECK_UNREACHED") == "1" and status(code) == "not checked"
            if status(code) not in ("survived", "no tests", "suspicious") and not unreached:
                continue
            result = (pytest(stage, run_tests + tests, key, UNREACHED_TIMEOUT_S) if unreached
                      else pytest(stage, tests, key, timeout))
            if result == TIMEOUT or result == 1:
                codes[key] = result
            elif result == 0 and unreached:
                codes[key] = 0  # survived
            elif result != 0:
                sys.exit(f"pytest ended with {result} on {key}: run it by hand in {stage}")
            print(f"{key}: {status(codes[key])}", file=sys.stderr)
            path.write_text(json.dumps(meta))  # each verdict kept, should the recheck be stopped


if __name__ == "__main__":
    main()
