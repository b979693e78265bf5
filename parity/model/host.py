"""What this host has: a TPU attached, libtpu (the TPU compiler) installed; and what libtpu is told
about it for compile-only use. Standard library only: read before jax is imported
(parity/__init__.py sets JAX_PLATFORMS from it)."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
from collections.abc import MutableMapping

# What libtpu reads at start-up to learn the TPU slice this host is part of. On a host with no TPU
# (nothing to ask: jax sets TPU_SKIP_MDS_QUERY there, no cloud metadata query) libtpu takes an unset
# one's value to be the text "WARNING: could not determine ..." and logs it as an error on stderr
# ("Failed to find host bounds for accelerator type: WARNING: ...", "E0000 ... unexpected worker
# hostname 'WARNING: ...'" with a source location trace), although compiling for a compile-only
# topology (parity.execute.tpu_compile) uses none of them.
TPU_SLICE_ENV = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_HOST_BOUNDS",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_PROCESS_BOUNDS",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "TPU_PROCESS_ADDRESSES",
)
# A compile-only host as what it is: one host, this one. What compiles is the same with and without
# it (measured, libtpu 0.0.42.1: the same compile records, Mosaic modules and memory, for Simple
# GLA's forward and backward kernels on v5e, v6e and TPU7x).
COMPILE_ONLY_SLICE = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_HOST_BOUNDS": "1,1,1"}


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


def cuda_devices() -> int:
    """The CUDA GPUs this host shows (/dev/nvidia<N>, within CUDA_VISIBLE_DEVICES), without importing torch."""
    found = len(glob.glob("/dev/nvidia[0-9]*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    return min(found, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))


def compile_only_slice(env: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Describe this host to libtpu as a slice of one host (COMPILE_ONLY_SLICE) in `env`, before
    libtpu loads for compile-only use; the variables it set. Nothing where a TPU is attached (libtpu
    asks the hardware and the cloud there) or where any TPU_SLICE_ENV variable is already set (the
    user's description of the slice wins, whole)."""
    if tpu_attached() or any(name in env for name in TPU_SLICE_ENV):
        return {}
    env.update(COMPILE_ONLY_SLICE)
    return dict(COMPILE_ONLY_SLICE)


def keep_jax_on_the_cpu(env: MutableMapping[str, str] = os.environ) -> bool:
    """In the harness's own processes (the `parity` command, its workers, FLA's lanes), before jax is
    imported: JAX_PLATFORMS=cpu where no TPU is attached (a user's own JAX_PLATFORMS wins). Off a TPU
    the jax candidates run in TPU interpret mode under the TPU numerics model, on the CPU: a GPU jax
    would take 75% of the GPU's memory in every worker (XLA's preallocation) beside FLA's lanes, and
    compute float32 dots its own way. True when it set it."""
    if tpu_attached() or "JAX_PLATFORMS" in env:
        return False
    env["JAX_PLATFORMS"] = "cpu"
    return True
