"""What this host has: a TPU attached, libtpu (the TPU compiler) installed. Standard library only:
read before jax is imported (parity/__init__.py sets JAX_PLATFORMS from it)."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util


def tpu_attached() -> bool:
    """A TPU chip is visible to this host (TPU VMs expose /dev/accel* or /dev/vfio/<n>)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def libtpu_installed() -> bool:
    """libtpu (the TPU compiler and runtime) is importable."""
    return importlib.util.find_spec("libtpu") is not None


def libtpu_version() -> str | None:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None
