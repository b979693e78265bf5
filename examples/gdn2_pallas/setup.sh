#!/usr/bin/env bash
# gdn2-pallas from the package registry, without dependencies (it imports only jax and numpy),
# into its own directory: atomic-ops 0.2.0 ships a different package of the same name, atomic_ops
# (gdn2_pallas_adapter.py's docstring). The adapter looks there ($GDN2_PALLAS_TARGET to change it).
set -euo pipefail
PY="${PYTHON:-python}"
TARGET="${GDN2_PALLAS_TARGET:-$("$PY" -c 'import sys; print(sys.prefix)')/pkgs/gdn2-pallas-0.1.1}"
"$PY" -m pip install -q --no-deps --upgrade --target "$TARGET" "gdn2-pallas==0.1.1"
