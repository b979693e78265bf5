# Sourced by the README's commands: create or reuse .venv in the repo root and install the
# project into it from nothing. On a machine without CUDA it takes torch's CPU build
# (torch==2.13.0) and jax for CPU; it never pulls CUDA wheels there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY="$ROOT/.venv/bin/python"
stamp=".venv/.parity-installed-$(sha256sum pyproject.toml scripts/env.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VPY" -m pip install -q --upgrade pip
  if ! "$VPY" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then "$VPY" -m pip install -q torch
    else "$VPY" -m pip install -q "torch==2.13.0"; fi
  fi
  "$VPY" -m pip install -q -e ".[test]"
  touch "$stamp"
fi
export PATH="$ROOT/.venv/bin:$PATH"
