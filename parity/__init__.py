"""Cross-framework parity harness for linear-attention kernels."""
import glob as _glob
import os as _os

SCHEMA_VERSION = 1


def tpu_attached() -> bool:
    """A TPU chip is visible to this host (TPU VMs expose /dev/accel* or /dev/vfio/<n>)."""
    return bool(_glob.glob("/dev/accel*") or _glob.glob("/dev/vfio/[0-9]*"))


# With libtpu installed (for compiling to TPU targets), jax would otherwise try to initialise
# the TPU backend on a CPU-only machine: execution stays on the CPU there. Set before jax is
# imported (jax reads JAX_PLATFORMS once); a user's own JAX_PLATFORMS wins.
if not tpu_attached():
    _os.environ.setdefault("JAX_PLATFORMS", "cpu")
