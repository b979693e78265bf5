#!/usr/bin/env bash
# ejkernel from the package registry without its dependencies (chex, pydantic, tqdm, ... are
# imported only by the package __init__s, which ejkernel_gdn_adapter.load skips), and what the
# gated delta rule's own modules import: beartype, jaxtyping (and its wadler_lindig); all into their
# own directory (ejkernel's wheel also brings top-level packages of other names: tests, tools, ...),
# where the adapter looks ($EJKERNEL_TARGET).
set -euo pipefail
PY="${PYTHON:-python}"
TARGET="${EJKERNEL_TARGET:-$("$PY" -c 'import sys; print(sys.prefix)')/pkgs/ejkernel-0.0.80.3}"
"$PY" -m pip install -q --no-deps --upgrade --target "$TARGET" \
  "ejkernel==0.0.80.3" "beartype==0.23.1" "jaxtyping==0.3.11" "wadler_lindig==0.1.8"
