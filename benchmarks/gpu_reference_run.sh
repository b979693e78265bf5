#!/usr/bin/env bash
# The GPU side of the cross-machine gate, on a machine with CUDA and FLA installed (no
# Pallas there): each suite through the oracle and FLA compiled on CUDA, FLA's raw tensors
# for benchmarks/fla_cuda_vs_interpreter.py, and the pytest `gpu` marker.
#
#   bash benchmarks/gpu_reference_run.sh OUT STEP [STEP ...]
#     STEP: run:SUITE      parity run --suite SUITE --backends oracle,fla -> OUT/SUITE
#           run:realistic  the full suite's cases with B*T*H*K*V <= 2^30 (the oracle's cost)
#           npz:SUITE      FLA's tensors per case -> OUT/npz-SUITE (fla_cuda_vs_interpreter.py save)
#           pytest:SUITE   pytest -m gpu --parity-suite SUITE -> OUT/pytest-SUITE
# Then, on any machine: parity gate OUT/ci <candidate reports of the ci suite>.
# JOBS (default 8) sets -j; every step's log goes to OUT/<step>.log.
set -uo pipefail
OUT="$1"; shift
JOBS="${JOBS:-8}"
mkdir -p "$OUT"
status=0
for step in "$@"; do
  kind="${step%%:*}"; suite="${step#*:}"
  echo "=== $step ($(date +%T))"
  t0=$(date +%s)
  case "$kind" in
    run)
      sel=(--suite "$suite")
      if [ "$suite" = realistic ]; then
        python3 -c "import json; from cases import get_suite; print(json.dumps([c.id for c in get_suite('full') if c.B * c.T * c.H * c.K * c.V <= 2 ** 30]))" > "$OUT/realistic.json"
        sel=(--cases "$OUT/realistic.json")
      fi
      python3 -m parity run "${sel[@]}" --backends oracle,fla -j "$JOBS" --no-progress --no-html \
        --out "$OUT/$suite" > "$OUT/$step.log" 2>&1 || status=$? ;;
    npz)
      python3 benchmarks/fla_cuda_vs_interpreter.py save "$OUT/npz-$suite" --suite "$suite" > "$OUT/$step.log" 2>&1 || status=$? ;;
    pytest)
      python3 -m pytest -p no:cacheprovider -o addopts="" -q -n "$JOBS" -m gpu tests/test_parity.py --parity-suite "$suite" \
        --parity-report-dir="$OUT/pytest-$suite" > "$OUT/$step.log" 2>&1 || status=$? ;;
    *) echo "unknown step $step" >&2; status=2 ;;
  esac
  echo "    $(( $(date +%s) - t0 )) s, exit $status; last lines:"
  tail -n 4 "$OUT/$step.log" | cut -c1-300
done
exit "$status"
