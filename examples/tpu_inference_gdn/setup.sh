#!/usr/bin/env bash
# tpu-inference's kernels, from the package registry, without vLLM: --no-deps (its GDN kernels
# import only jax; gdn_adapter.load skips the package's __init__, which imports vLLM).
set -euo pipefail
python -m pip install -q --no-deps "tpu-inference==0.32.0"
