"""Cross-framework parity harness for linear-attention kernels.

Layers, each importing only from those below it (pyproject.toml's import-linter contracts;
README "Architecture"): model -> measure -> records -> mutants -> execute -> judge -> surfaces
(cli, pytest_plugin, html, fuzz, repro).
"""

import os as _os

from parity.model.host import libtpu_installed, tpu_attached

# With libtpu installed (for compiling to TPU targets), jax would otherwise try to initialise
# the TPU backend on a machine without a TPU (and hold its lockfile): execution stays on the CPU
# there. Only then: a GPU user's jax (the pytest plugin imports this package in every session)
# keeps its own platform. Set before jax is imported (jax reads JAX_PLATFORMS once); a user's
# own JAX_PLATFORMS wins.
if not tpu_attached() and libtpu_installed():
    _os.environ.setdefault("JAX_PLATFORMS", "cpu")
