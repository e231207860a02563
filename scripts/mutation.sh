#!/usr/bin/env bash
# Mutation testing with mutmut, bounded in time: which deliberate bugs in the given modules pass
# every selected test. Writes a report (score, survivors with file:line and the mutation).
#
#   scripts/mutation.sh vlserve/cache/radix_cache.py vlserve/sampling/sampler.py preprocess/hashing.py
#
#   MUTATION_MINUTES  wall-clock budget of the mutmut run (default 10); mutants not reached are listed
#                     as "not checked". Fastest-to-test mutants run first.
#   MUTATION_JOBS     parallel mutants (default 2)
#   MUTATION_TESTS    pytest paths to run (default: per module, see tests_for below)
#   MUTATION_DIR      staging folder (default /tmp/vlserve-mutation; wiped first)
#   MUTATION_REPORT   the report to write (default benchmarks/results/mutation.md)
#   MUTATION_RECHECK  test paths written since the run: the previous run's staging folder is kept, each
#                     of its surviving mutants runs these tests, and the report shows the score before
#                     (the run's) and after (scripts/mutation_recheck.py). Same modules and MUTATION_DIR.
#                     With MUTATION_RECHECK_UNREACHED=1 the mutants the run did not reach run the new tests
#                     and then its own (slow: the whole selection per mutant); one still running after
#                     MUTATION_RECHECK_TIMEOUT seconds (default 900) hung them: a timeout, as in mutmut.
#                     Each mutant's tests run in a fork of one process that imported torch once.
# To carry on a run that stopped at its budget: cd MUTATION_DIR and `mutmut run NAME...` with the names of
# the mutants not checked yet (their exit code is null in mutants/**/*.py.meta), then write the report
# with scripts/mutation_report.py (benchmarks/results/mutation_admission.md did so).
#
# Why a staging folder: kernels/ and preprocess/ install as vlserve.kernels and vlserve.preprocess
# (setup.py's package_dir), so mutmut, which mutates a copy and puts it first on sys.path, must see
# the installed layout: the copy is vlserve/ with kernels/ and preprocess/ inside it, plus tests/.
# The work tree is never modified.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${VLSERVE_VENV:-.venv}/bin/python
case "$PY" in /*) ;; *) PY=$ROOT/$PY ;; esac
MINUTES=${MUTATION_MINUTES:-10}
JOBS=${MUTATION_JOBS:-2}
STAGE=${MUTATION_DIR:-/tmp/vlserve-mutation}
REPORT=${MUTATION_REPORT:-benchmarks/results/mutation.md}
case "$REPORT" in /*) ;; *) REPORT=$ROOT/$REPORT ;; esac
[ $# -gt 0 ] || { echo "usage: scripts/mutation.sh MODULE.py..." >&2; exit 2; }
"$PY" -c "import mutmut" 2>/dev/null || { echo "mutmut is missing: scripts/run.sh setup (dev extra)" >&2; exit 2; }

staged_path() {  # repo path -> path in the installed layout
  case "$1" in
    kernels/*|preprocess/*) echo "vlserve/$1" ;;
    *) echo "$1" ;;
  esac
}

tests_for() {  # the tests that exercise a module (a mutant runs only those of them that call its function)
  case "$1" in
    vlserve/cache/radix_cache.py) echo tests/test_radix_cache.py tests/test_radix_cache_properties.py tests/test_radix_integrity_check.py ;;
    vlserve/sampling/sampler.py) echo tests/test_sampler.py ;;
    preprocess/hashing.py) echo tests/test_preprocess_hash.py tests/test_media_keys.py ;;
    *) grep -l "$(echo "${1%.py}" | sed 's#^preprocess/#vlserve/preprocess/#; s#^kernels/#vlserve/kernels/#; s#/#.#g')" tests/test_*.py ;;
  esac
}

if [ -n "${MUTATION_RECHECK:-}" ]; then
  [ -f "$STAGE/pyproject.toml" ] || { echo "no previous run in $STAGE to recheck" >&2; exit 2; }
  rm -rf "$STAGE/tests" && cp -r tests "$STAGE/"  # the new tests; the mutated code stays as it was
  read -r -a recheck <<< "$MUTATION_RECHECK"
  "$PY" scripts/mutation_recheck.py "$STAGE" "${recheck[*]}" "$@"
  "$PY" scripts/mutation_report.py "$STAGE" "$REPORT" "$(cat "$STAGE/seconds")" "$(cat "$STAGE/tests.txt")" "$@"
  echo "wrote $REPORT" >&2
  exit 0
fi

rm -rf "$STAGE" && mkdir -p "$STAGE"
cp -r vlserve tests "$STAGE/"
rm -rf "$STAGE/vlserve/kernels" "$STAGE/vlserve/preprocess"
cp -r kernels "$STAGE/vlserve/kernels"
cp -r preprocess "$STAGE/vlserve/preprocess"
find "$STAGE" -name __pycache__ -prune -exec rm -rf {} +

only=() tests=()
for m in "$@"; do
  [ -f "$m" ] || { echo "no such module: $m" >&2; exit 2; }
  only+=("\"$(staged_path "$m")\"")
  read -r -a t <<< "${MUTATION_TESTS:-$(tests_for "$m")}"
  tests+=("${t[@]}")
done
tests=($(printf '%s\n' "${tests[@]}" | sort -u))
[ ${#tests[@]} -gt 0 ] || { echo "no tests found for $*; set MUTATION_TESTS" >&2; exit 2; }
quoted=$(printf '"%s", ' "${tests[@]}")
cat > "$STAGE/pyproject.toml" <<TOML
[tool.pytest.ini_options]
testpaths = ["tests"]
timeout = 600
markers = ["slow", "browser", "distributed", "gpu"]

[tool.mutmut]
source_paths = ["vlserve"]
only_mutate = [$(IFS=,; echo "${only[*]}")]
pytest_add_cli_args = ["-p", "no:randomly", "-p", "no:cacheprovider", "-q"]
pytest_add_cli_args_test_selection = [${quoted%, }]
use_git_change_detection = false
TOML

echo "mutmut on $* with ${tests[*]}, ${MINUTES} min, ${JOBS} jobs, in $STAGE" >&2
start=$(date +%s)
# SIGINT lets mutmut stop its workers and keep every verdict so far; KILL 60 s later if it hangs.
(cd "$STAGE" && timeout -s INT -k 60 "$((MINUTES * 60))" "$PY" -m mutmut run --max-children "$JOBS" \
   > "$STAGE/mutmut-run.log" 2>&1) || echo "mutmut stopped (exit $?): see $STAGE/mutmut-run.log" >&2
echo "$(( $(date +%s) - start ))" > "$STAGE/seconds"
echo "${tests[*]}" > "$STAGE/tests.txt"
"$PY" scripts/mutation_report.py "$STAGE" "$REPORT" "$(cat "$STAGE/seconds")" "${tests[*]}" "$@"
echo "wrote $REPORT" >&2
