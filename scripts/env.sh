# Sourced by the README's commands: create or reuse .venv in the repo root and install the
# project into it from nothing. On a machine without CUDA it takes torch's CPU build
# (torch==2.13.0), jax for CPU and the libtpu jax pins (to compile for TPU targets); it never
# pulls CUDA wheels there. The set-up runs in a subshell under `set -euo pipefail`, so those
# options do not leak into the shell that sources this (an interactive shell would end at its
# next failing command); a failed set-up returns 1. Leaves the caller in the repo root with
# .venv/bin first on PATH.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || return 1
if ! (
set -euo pipefail
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY="$ROOT/.venv/bin/python"
stamp=".venv/.parity-installed-$(sha256sum pyproject.toml scripts/env.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VPY" -m pip install -q --upgrade pip
  # the example libraries (tests/test_examples.py runs them), from the registry without their
  # dependencies, each into its own --target directory, where its adapter looks (its setup.sh: the
  # same), never into the environment: tpu-inference's GDN kernels import only jax, but its wheel
  # declares vLLM's requirements (pip's resolver would print each as an ERROR); ejkernel's gated
  # delta rule imports jax, beartype and jaxtyping only (the adapter skips the package __init__s),
  # and its wheel brings top-level packages of other names (tests, tools, ...); gdn2-pallas and
  # atomic-ops import only jax and numpy, and both ship a top-level package `atomic_ops`.
  # The older Triton versions tested (3.6.0: torch 2.11's; 3.7.1: torch 2.12.1's; 3.9.0 is the
  # environment's own), the same way: each into its own --target directory, never into the
  # environment (pip would replace torch's own Triton); tests/test_triton_versions.py runs FLA
  # through the interpreter under each by putting its directory first on PYTHONPATH.
  # Nothing installs into these directories but their own pip, so they install side by side with
  # the environment's packages below (one pip uses one core); each must succeed.
  target() {  # target DIR REQUIREMENT...: install into .venv/pkgs/DIR
    local dir=$1
    shift
    "$VPY" -m pip install -q --no-deps --upgrade --target "$ROOT/.venv/pkgs/$dir" "$@"
  }
  pids=()
  target tpu-inference-0.32.0 "tpu-inference==0.32.0" & pids+=($!)
  target ejkernel-0.0.80.3 "ejkernel==0.0.80.3" "beartype==0.23.1" "jaxtyping==0.3.11" "wadler_lindig==0.1.8" & pids+=($!)
  target gdn2-pallas-0.1.1 "gdn2-pallas==0.1.1" & pids+=($!)
  target atomic-ops-0.2.0 "atomic-ops==0.2.0" & pids+=($!)
  target triton-3.6.0 "triton==3.6.0" & pids+=($!)
  target triton-3.7.1 "triton==3.7.1" & pids+=($!)
  if ! "$VPY" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then "$VPY" -m pip install -q torch
    else "$VPY" -m pip install -q "torch==2.13.0"; fi
  fi
  "$VPY" -m pip install -q -e ".[test]"
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    # the real TPU compiler (deviceless compile for TPU targets): the libtpu jax's own `tpu`
    # extra pins for the installed jax, never a newer one; execution stays on the CPU
    # (parity sets JAX_PLATFORMS=cpu where no TPU is attached)
    jaxv="$("$VPY" -c 'import importlib.metadata as m; print(m.version("jax"))')"
    "$VPY" -m pip install -q "jax[tpu]==$jaxv"
  fi
  for pid in "${pids[@]}"; do wait "$pid"; done  # set -e: a failed install fails the set-up
  touch "$stamp"
fi
); then
  echo "scripts/env.sh: setting up .venv failed (the lines above say where)" >&2
  return 1
fi
export PATH="$ROOT/.venv/bin:$PATH"
