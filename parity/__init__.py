"""Cross-framework parity harness for linear-attention kernels."""

import glob as _glob
import os as _os

SCHEMA_VERSION = 1


def tpu_attached() -> bool:
    """A TPU chip is visible to this host (TPU VMs expose /dev/accel* or /dev/vfio/<n>)."""
    return bool(_glob.glob("/dev/accel*") or _glob.glob("/dev/vfio/[0-9]*"))


def libtpu_installed() -> bool:
    """libtpu (the TPU compiler and runtime) is importable."""
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


# With libtpu installed (for compiling to TPU targets), jax would otherwise try to initialise
# the TPU backend on a machine without a TPU (and hold its lockfile): execution stays on the CPU
# there. Only then: a GPU user's jax (the pytest plugin imports this package in every session)
# keeps its own platform. Set before jax is imported (jax reads JAX_PLATFORMS once); a user's
# own JAX_PLATFORMS wins.
if not tpu_attached() and libtpu_installed():
    _os.environ.setdefault("JAX_PLATFORMS", "cpu")
