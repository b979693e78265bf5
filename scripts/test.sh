#!/usr/bin/env bash
# The tests: lint and format checks (ruff), the layer contracts over the real import graph
# (import-linter; both configured in pyproject.toml), unit tests of every
# part (the real TPU compiler included: every suite's kernels compiled for TPU targets, the
# full suite on v5e, v6e and TPU7x), then the registry-driven parity tests of the ci suite
# through the CPU interpreters (-m interpret) under the TPU numerics model, each case's kernels
# compiled for v5e, with the gate at session end. Any failing step fails the run.
# Usage: bash scripts/test.sh [extra pytest args]
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/browser.sh"
status=0
ruff check . || status=$?
ruff format --check . || status=$?
lint-imports || status=$?
python -m pytest -n 2 -m "not interpret and not slow" tests "$@" || status=$?
python -m pytest -n 2 -m interpret --parity-suite ci --parity-tpu-targets v5e tests "$@" || status=$?
exit "$status"
