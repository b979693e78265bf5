#!/usr/bin/env bash
# The GPU truth: the GPU side's speed and FLA compiled on CUDA against FLA in the Triton interpreter,
# each as a timed step; docs/fla-on-gpu.md's tables come from it.
#
# 1. On a CPU machine with the project set up (scripts/env.sh), beforehand:
#      bash benchmarks/gpu_truth.sh prepare DIR
#    DIR/cpu/<suite>: the interpreter's records (oracle and fla, SEEDS seeds per case) of SUITES;
#    DIR/cache: the oracle's cache of those cases (the diff steps on the GPU machine reuse it);
#    DIR/wheels: fla-core and the pure-Python packages the harness needs, for a GPU machine's Python
#    that lacks them (CPython 3.12 binaries where one is compiled).
# 2. On the machine with the GPU (torch with CUDA, Triton; nothing else needs the network), with DIR
#    carried along:
#      bash benchmarks/gpu_truth.sh run DIR
#    installs what is missing from DIR/wheels, then runs each step of STEPS (default all, in this
#    order) under its own `timeout` (a slow step leaves the others' figures), its terminal in
#    DIR/gpu/<step>.log, one line in DIR/gpu/steps.txt as it ends, and at the end the table
#    DIR/gpu/table.md (step, command, limit, seconds, exit, within the limit):
#      smoke-cold    parity run --suite smoke, every default backend, empty harness and Triton caches  60 s
#      smoke-warm    the same again, both caches kept                                                   20 s
#      pytest-smoke  pytest -m gpu tests/test_parity.py --parity-suite smoke -n 4, empty caches          60 s
#      ci-cold       parity run --suite ci --backends oracle,fla --seeds 2:2, empty caches               120 s
#      ci-warm       the same, --fresh (FLA runs again), Triton's cache kept                              30 s
#      ci-lanes2     ci-warm with --fla-lanes 2: does a second lane on the GPU shorten the run?
#      stages, models  each suite through oracle and FLA (SEEDS), for the diff
#      diff-<suite>  CUDA's records against the interpreter's (DIR/cpu/<suite>; ci from ci-cold): the
#                    ratios eps CUDA / eps interpreter per tensor and seed, those outside [0.8, 1.25]
# SUITES (default "ci stages models"), SEEDS (default 2:2), JOBS (default: the cores).
# On a machine without a GPU `run` runs FLA in the interpreter: a plumbing check (the diffs' ratios 1),
# not the GPU's figures.
set -uo pipefail
cmd="${1:?usage: gpu_truth.sh prepare|run DIR}"
DIR="$(mkdir -p "${2:?usage: gpu_truth.sh prepare|run DIR}" && cd "$2" && pwd)"
SUITES="${SUITES:-ci stages models}"
SEEDS="${SEEDS:-2:2}"
JOBS="${JOBS:-$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')}"
STEPS="${STEPS:-smoke-cold smoke-warm pytest-smoke ci-cold ci-warm ci-lanes2 stages models diff-ci diff-stages diff-models}"
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=cpu

step() {  # step NAME LIMIT_S TIMEOUT_S COMMAND...: COMMAND under `timeout`, logged; a line of steps.txt and of the table
  local name="$1" limit="$2" cap="$3"
  shift 3
  local t0 rc ms s within
  t0=$(date +%s%N)
  timeout -k 10 "$cap" bash -c '"$@"' "$name" "$@" >"$OUT/$name.log" 2>&1  # bash -c: the functions below too
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  s="$((ms / 1000)).$((ms % 1000 / 100))"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then within="timed out at $cap s"
  elif [ "$limit" = "-" ]; then within="-"
  elif [ "$ms" -le $((limit * 1000)) ] && [ "$rc" -le 1 ]; then within="yes"
  else within="no"; fi
  printf '%-14s %7s s  exit %-3s  limit %-4s %s\n' "$name" "$s" "$rc" "$limit" "$within" | tee -a "$OUT/steps.txt"
  printf '| %s | `%s` | %s | %s | %s | %s |\n' "$name" "${*:1:14}" "$limit" "$s" "$rc" "$within" >>"$OUT/table.rows"
  grep -h "FLA pre-compile" "$OUT/$name.log" | head -n 2 | cut -c1-300
  tail -n 2 "$OUT/$name.log" | cut -c1-240
  return 0
}

empty_caches() {  # an empty harness cache and an empty Triton cache for the next step
  rm -rf "$OUT/cache" "$OUT/triton"
  export PARITY_CACHE="$OUT/cache" TRITON_CACHE_DIR="$OUT/triton"
}

suite_run() {  # suite_run SUITE OUTDIR [ARGS...]: the suite through oracle and FLA
  local suite="$1" out="$2"
  shift 2
  python3 -m parity run --suite "$suite" --backends oracle,fla --seeds "$SEEDS" -j "$JOBS" --tpu-targets none \
    --no-progress --no-html --out "$out" "$@"
}

ratios() {  # ratios CPU_DIR GPU_DIR: eps CUDA / eps interpreter over the (case, fla) pairs CUDA has
  python3 - "$1" "$2" <<'PY'
import math, statistics, sys
from pathlib import Path
from parity.records import load_latest

cpu, gpu = load_latest([Path(sys.argv[1])]), load_latest([Path(sys.argv[2])])
ratios, outside, missing = [], [], 0
for case_id, recs in sorted(gpu.items()):
    g, c = recs.get("fla"), cpu.get(case_id, {}).get("fla")
    if g is None or c is None or g["status"] != "ok" or c["status"] != "ok":
        missing += g is not None
        continue
    for name, t in sorted(g["tensors"].items()):
        a, b = t.get("rel_rms"), c["tensors"].get(name, {}).get("rel_rms")
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
            continue
        r = a / b
        ratios.append(r)
        if not 0.8 <= r <= 1.25:
            outside.append(f"{case_id} {name}: {r:.3g} (CUDA {a:.3g}, interpreter {b:.3g})")
if not ratios:
    sys.exit("no tensor both ran")
print(f"{len(ratios)} tensors: median {statistics.median(ratios):.3g}, min {min(ratios):.3g}, max {max(ratios):.3g}; "
      f"{len(outside)} outside [0.8, 1.25]; {missing} FLA records not ok on one side")
print("\n".join(outside))
PY
}

export -f suite_run ratios
export SEEDS JOBS

case "$cmd" in
  prepare)
    source scripts/env.sh || exit 1  # the project's .venv: FLA in the interpreter
    OUT="$DIR/cpu"; mkdir -p "$OUT" "$DIR/wheels"
    export PARITY_CACHE="$DIR/cache"
    set -e
    python3 -m pip download -q --no-deps -d "$DIR/wheels" "fla-core==$(python3 -c 'import importlib.metadata as m; print(m.version("fla-core"))')" \
      einops jinja2 plotly narwhals hypothesis sortedcontainers attrs packaging
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux2014_x86_64 -d "$DIR/wheels" markupsafe ml_dtypes
    set +e
    for suite in $SUITES; do step "run-$suite" - 3600 suite_run "$suite" "$OUT/$suite"; done
    du -sh "$DIR"/* ;;
  run)
    OUT="$DIR/gpu"; mkdir -p "$OUT"; rm -f "$OUT/steps.txt" "$OUT/table.rows"
    for mod in fla:fla-core einops:einops jinja2:jinja2 markupsafe:markupsafe plotly:plotly narwhals:narwhals \
               hypothesis:hypothesis sortedcontainers:sortedcontainers attr:attrs ml_dtypes:ml_dtypes; do
      python3 -c "import ${mod%%:*}" 2>/dev/null ||
        python3 -m pip install -q --no-index --no-deps --find-links "$DIR/wheels" "${mod#*:}"
    done
    python3 -c 'import torch; print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none (FLA in the interpreter: a plumbing check)")' | tee "$OUT/steps.txt"
    python3 -c 'import os, torch, triton, importlib.metadata as m; print("torch", torch.__version__, "triton", triton.__version__, "fla-core", m.version("fla-core"), "cores", len(os.sched_getaffinity(0)))' | tee -a "$OUT/steps.txt"
    for s in $STEPS; do
      case "$s" in
        smoke-cold) empty_caches
          step smoke-cold 60 300 python3 -m parity run --suite smoke -j "$JOBS" --no-progress --out "$OUT/smoke" ;;
        smoke-warm)
          step smoke-warm 20 120 python3 -m parity run --suite smoke -j "$JOBS" --no-progress --out "$OUT/smoke-warm" ;;
        pytest-smoke) empty_caches
          step pytest-smoke 60 300 python3 -m pytest -p no:cacheprovider -o addopts="" -q -n 4 -m gpu \
            tests/test_parity.py --parity-suite smoke --parity-report-dir="$OUT/pytest-smoke" ;;
        ci-cold) empty_caches
          step ci-cold 120 400 suite_run ci "$OUT/ci" ;;
        ci-warm)
          step ci-warm 30 200 suite_run ci "$OUT/ci-warm" --fresh ;;
        ci-lanes2)
          step ci-lanes2 - 200 suite_run ci "$OUT/ci-lanes2" --fresh --fla-lanes 2 ;;
        stages|models)
          export PARITY_CACHE="$DIR/cache" TRITON_CACHE_DIR="$OUT/triton"
          step "$s" - 600 suite_run "$s" "$OUT/$s" ;;
        diff-*) suite="${s#diff-}"
          step "$s" - 120 ratios "$DIR/cpu/$suite" "$OUT/$suite" ;;
        *) echo "gpu_truth.sh: unknown step $s" >&2 ;;
      esac
    done
    { echo "| step | command | limit (s) | seconds | exit | within |"; echo "|---|---|---|---|---|---|"
      cat "$OUT/table.rows"; } >"$OUT/table.md"
    cat "$OUT/steps.txt" ;;
  *) echo "gpu_truth.sh: unknown command $cmd (prepare or run)" >&2; exit 2 ;;
esac
