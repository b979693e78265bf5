#!/usr/bin/env bash
# The tests: lint and format checks (ruff), the layer contracts over the real import graph
# (import-linter; both configured in pyproject.toml), then one pytest session: unit tests of every
# part (the real TPU compiler included: every suite's kernels compiled for TPU targets, the full
# suite on v5e, v6e and TPU7x) and the registry-driven parity tests of the ci and stages suites
# through the CPU interpreters (-m interpret) under the TPU numerics model, each case's kernels
# compiled for v5e, with the gate at session end. Any failing step fails the run. At the end it prints the
# wall time of each phase; the per-test timings (JUnit XML) stay in $PARITY_TIMING
# (default reports/timing) for `python benchmarks/profile_ci.py`. jax's compilation cache lives for
# the run only (a temporary directory, unless JAX_COMPILATION_CACHE_DIR is set).
# Usage: bash scripts/test.sh [extra pytest args]
t_start=$(date +%s.%N)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" || exit 1
source "$(dirname "${BASH_SOURCE[0]}")/browser.sh"
TIMING="${PARITY_TIMING:-reports/timing}"
# one jax compilation cache for the run, shared by both passes and their workers: the XLA:CPU
# programs jax persists (not the interpret-mode kernels: jax keeps programs with host callbacks
# out) are compiled once per run; TPU compiles never go through it (parity.execute.compile_log.for_tpu);
# a cache you set yourself is used instead and kept
run_cache=$(mktemp -d)
trap 'rm -rf "$run_cache"' EXIT
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$run_cache}"
mkdir -p "$TIMING"
T=$'\t'
phases=("set-up (venv, packages, chromium)$T$(awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b-a}')")
status=0
phase() {  # phase NAME CMD...: run CMD, note its wall time and exit status
  local name=$1 t0 rc=0
  shift
  t0=$(date +%s.%N)
  "$@" || rc=$?
  phases+=("$name$T$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b-a}')$T${rc/#0/}")
  [ "$rc" = 0 ] || status=$rc
}
phase "ruff check" ruff check .
phase "ruff format" ruff format --check .
phase "lint-imports" lint-imports
# one pytest session, two workers sharing out every test: the unit tests and the parity tests of the
# ci and stages suites (-m interpret); the gpu and tpu parity tests are left out (no GPU, no TPU here)
phase "tests (unit and interpret parity)" python -m pytest -n 2 --dist worksteal \
  -m "interpret or not (gpu or tpu or slow)" --parity-suite ci,stages --parity-tpu-targets v5e \
  --junitxml="$TIMING/tests.xml" tests "$@"
# the page over every ci and stages case the built-in kernels just gave (records of the session above)
phase "page over the interpret records" parity report reports/pytest -o reports/pytest/index.html
phases+=("total$T$(awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b-a}')")
printf '%s\n' "${phases[@]}" >"$TIMING/phases.txt"
echo
echo "wall time per phase (s); exit status if not 0:"
awk -F'\t' '{printf "  %-36s %6s %s\n", $1, $2, $3}' "$TIMING/phases.txt"
exit "$status"
