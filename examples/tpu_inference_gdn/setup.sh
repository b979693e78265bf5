#!/usr/bin/env bash
# tpu-inference's kernels, from the package registry, without vLLM: --no-deps (its GDN kernels
# import only jax; gdn_adapter.load skips the package's __init__, which imports vLLM), into their own
# directory, so that its declared vLLM requirements never meet the environment's packages (pip's
# resolver would list each as a conflict); the adapter looks there ($TPU_INFERENCE_TARGET).
set -euo pipefail
PY="${PYTHON:-python}"
TARGET="${TPU_INFERENCE_TARGET:-$("$PY" -c 'import sys; print(sys.prefix)')/pkgs/tpu-inference-0.32.0}"
"$PY" -m pip install -q --no-deps --upgrade --target "$TARGET" "tpu-inference==0.32.0"
