"""Reruns a mutmut run's surviving mutants against tests written after it (scripts/mutation.sh with
MUTATION_RECHECK): each survivor runs the new tests with its mutation switched on, and a failing test
turns it into a kill in the run's records. The verdicts of the run itself are kept once, in
before.json, for the report's "before" table.

    python scripts/mutation_recheck.py STAGE "TESTS" MODULE.py...

A survivor runs only the new tests (the run's own already passed with it). With
MUTATION_RECHECK_UNREACHED=1, mutants the run did not reach run the run's tests too (STAGE/tests.txt),
so they end checked: the new tests first (pytest stops at the first failure, and the new tests are the
fast ones), and a mutant still running after MUTATION_RECHECK_TIMEOUT seconds (default 900) hung the
tests: a kill, as mutmut counts a timeout.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

from mutation_report import staged, status

TIMEOUT = 36  # mutmut's exit code for a mutant that hung the tests
UNREACHED_TIMEOUT_S = float(os.environ.get("MUTATION_RECHECK_TIMEOUT", 900))  # one that runs the run's tests too


def preload(stage: Path) -> None:
    """Imports pytest, torch and the staged, mutated vlserve once; every mutant's tests then run in a
    fork of this process (as mutmut runs them), so none pays the imports again. The staged original
    vlserve/ is never on sys.path: the mutants' copy is first."""
    os.chdir(stage)
    sys.path.insert(0, str(stage / "mutants"))
    import pytest  # noqa: F401
    import torch  # noqa: F401
    import vlserve

    if not Path(vlserve.__file__).is_relative_to(stage / "mutants"):
        sys.exit(f"vlserve imports from {vlserve.__file__}, not from {stage / 'mutants'}")


def pytest(stage: Path, tests: list[str], mutant: str, timeout: float) -> int:
    """pytest's exit code for the tests with this mutant on ("" = the original code), or TIMEOUT."""
    pid = os.fork()
    if pid == 0:  # the child: its exit code is pytest's
        os.environ["MUTANT_UNDER_TEST"] = mutant  # mutmut's trampolines read it at every call
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            import pytest as pt
            code = int(pt.main(["-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *tests]))
        except BaseException:
            code = 3
        os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status_word = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status_word)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return TIMEOUT
        time.sleep(0.05)


def main() -> None:
    stage, tests, modules = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
    run_tests = (stage / "tests.txt").read_text().split()
    preload(stage)
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
            everything = tests + [t for t in run_tests if t not in tests]
            result = (pytest(stage, everything, key, UNREACHED_TIMEOUT_S) if unreached
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
