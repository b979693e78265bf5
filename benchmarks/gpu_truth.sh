#!/usr/bin/env bash
# The GPU truth: FLA compiled on CUDA against FLA in the Triton interpreter, case by case and seed
# by seed, over the ci, stages and models suites; the table in docs/fla-on-gpu.md comes from it.
#
# 1. On a CPU machine with the project set up (scripts/env.sh), beforehand:
#      bash benchmarks/gpu_truth.sh prepare DIR
#    DIR/cpu/<suite>: the interpreter's records (oracle and fla, SEEDS seeds per case);
#    DIR/cache: the oracle's cache of those cases (the GPU machine reuses it);
#    DIR/wheels: fla-core and the pure-Python packages the harness needs, for a GPU machine's
#    Python that lacks them (CPython 3.12 binaries where one is compiled).
# 2. On the machine with the GPU (torch with CUDA, Triton; nothing else needs the network), with DIR
#    carried along:
#      bash benchmarks/gpu_truth.sh run DIR
#    installs what is missing from DIR/wheels, runs each suite through oracle and FLA on CUDA
#    (FLA's lanes: one process per GPU; Triton's autotune results kept in DIR/triton-cache), the ci
#    suite twice (cold cache, then warm), `pytest -m gpu` over ci when PYTEST=1, then
#    `parity diff DIR/cpu/<suite> DIR/gpu/<suite>` (eps CUDA / eps interpreter per tensor and seed).
#    Every step's log and time goes to DIR/gpu/steps.txt as it ends.
# SUITES (default "ci stages models"), SEEDS (default 8:8), JOBS (default: the cores, at most 14),
# FALLBACK (default none: a case CUDA refuses stays refused, with its cause and fix in the record).
# On a machine without a GPU `run` runs FLA in the interpreter: the diff then checks the plumbing
# (every ratio 1), not the GPU.
set -uo pipefail
cmd="${1:?usage: gpu_truth.sh prepare|run DIR}"
DIR="$(mkdir -p "${2:?usage: gpu_truth.sh prepare|run DIR}" && cd "$2" && pwd)"
SUITES="${SUITES:-ci stages models}"
SEEDS="${SEEDS:-8:8}"
JOBS="${JOBS:-$(python3 -c 'import os; print(min(14, os.cpu_count()))')}"
FALLBACK="${FALLBACK:-none}"
cd "$(dirname "$0")/.."
export PARITY_CACHE="$DIR/cache" JAX_PLATFORMS=cpu

step() {  # step NAME COMMAND...: run, log to DIR/<side>/NAME.log, one line of time and exit to steps.txt
  local name="$1"; shift
  local t0; t0=$(date +%s%N)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-28s %5d.%01d s  exit %s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) "$rc" | tee -a "$OUT/steps.txt"
  tail -n 3 "$OUT/$name.log" | cut -c1-240
  return 0
}

suite_run() {  # suite_run SUITE OUTDIR
  python3 -m parity run --suite "$1" --backends oracle,fla --seeds "$SEEDS" -j "$JOBS" --tpu-targets none \
    --fla-fallback "$FALLBACK" --no-progress --no-html --out "$2"
}

case "$cmd" in
  prepare)
    source scripts/env.sh || exit 1  # the project's .venv: FLA in the interpreter
    OUT="$DIR/cpu"; mkdir -p "$OUT" "$DIR/wheels"
    set -e
    python3 -m pip download -q --no-deps -d "$DIR/wheels" "fla-core==$(python3 -c 'import importlib.metadata as m; print(m.version("fla-core"))')" \
      einops jinja2 plotly narwhals hypothesis sortedcontainers attrs packaging
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux2014_x86_64 -d "$DIR/wheels" markupsafe ml_dtypes
    set +e
    for suite in $SUITES; do step "run-$suite" suite_run "$suite" "$OUT/$suite"; done
    du -sh "$DIR"/* ;;
  run)
    OUT="$DIR/gpu"; mkdir -p "$OUT"
    for mod in fla:fla-core einops:einops jinja2:jinja2 markupsafe:markupsafe plotly:plotly narwhals:narwhals \
               hypothesis:hypothesis sortedcontainers:sortedcontainers attr:attrs ml_dtypes:ml_dtypes; do
      python3 -c "import ${mod%%:*}" 2>/dev/null ||
        python3 -m pip install -q --no-index --no-deps --find-links "$DIR/wheels" "${mod#*:}"
    done
    python3 -c 'import torch; print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none (FLA in the interpreter: a plumbing check)")' | tee "$OUT/steps.txt"
    python3 -c 'import torch, triton, importlib.metadata as m; print("torch", torch.__version__, "triton", triton.__version__, "fla-core", m.version("fla-core"))' | tee -a "$OUT/steps.txt"
    export TRITON_CACHE_DIR="$DIR/triton-cache"
    rm -rf "$TRITON_CACHE_DIR"
    for suite in $SUITES; do
      step "run-$suite" suite_run "$suite" "$OUT/$suite"
      if [ "$suite" = ci ]; then step "run-ci-warm" suite_run ci "$OUT/ci-warm"; fi
    done
    if [ "${PYTEST:-0}" = 1 ]; then
      step pytest-ci python3 -m pytest -p no:cacheprovider -o addopts="" -q -n "$JOBS" -m gpu tests/test_parity.py \
        --parity-suite ci --parity-report-dir="$OUT/pytest-ci"
    fi
    for suite in $SUITES; do step "diff-$suite" python3 -m parity diff "$DIR/cpu/$suite" "$OUT/$suite" -v; done
    cat "$OUT/steps.txt" ;;
  *) echo "gpu_truth.sh: unknown command $cmd (prepare or run)" >&2; exit 2 ;;
esac
