#!/usr/bin/env bash
# The tests: unit tests of every part, then the registry-driven parity tests of the ci
# suite through the CPU interpreters (-m interpret) with the gate at session end.
# Usage: bash scripts/test.sh [extra pytest args]
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/browser.sh"
status=0
python -m pytest -n 2 -m "not interpret and not slow" tests "$@" || status=$?
python -m pytest -n 2 -m interpret --suite ci tests "$@" || status=$?
exit "$status"
