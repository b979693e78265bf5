#!/usr/bin/env bash
# atomic-ops from the package registry, without dependencies (atomic_gdn2 imports only jax and
# numpy), into its own directory: gdn2-pallas 0.1.1 ships a different package of the same name,
# atomic_ops (atomic_ops_adapter.py's docstring). The adapter looks there ($ATOMIC_OPS_TARGET).
set -euo pipefail
PY="${PYTHON:-python}"
TARGET="${ATOMIC_OPS_TARGET:-$("$PY" -c 'import sys; print(sys.prefix)')/pkgs/atomic-ops-0.2.0}"
"$PY" -m pip install -q --no-deps --upgrade --target "$TARGET" "atomic-ops==0.2.0"
