#!/usr/bin/env bash
# The main job: the smoke suite through every backend on this machine, per-case reports,
# the gate and the HTML page. Usage: bash scripts/smoke.sh [OUT_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" || exit 1
OUT="${1:-reports/smoke}"
parity run --suite smoke --out "$OUT" -j 2
