#!/usr/bin/env bash
# ejkernel from the package registry without its dependencies (chex, pydantic, tqdm, ... are
# imported only by the package __init__s, which ejkernel_gdn_adapter.load skips), and what the
# gated delta rule's own modules import: beartype, jaxtyping (and its wadler_lindig).
set -euo pipefail
PY="${PYTHON:-python}"
"$PY" -m pip install -q --no-deps "ejkernel==0.0.80.3" "beartype==0.23.1" "jaxtyping==0.3.11" "wadler_lindig==0.1.8"
