"""Where this session can run the gpu and tpu markers: whether a CUDA device or a TPU is there
(the reason a test is skipped when not). torch and jax are imported only when asked."""

from __future__ import annotations

import functools
import glob
import sys


def no_cuda_device() -> bool:
    """No CUDA device here. On Linux, without /dev/nvidia<N> there is none (no torch import);
    with one, torch decides (a CPU build of torch has no CUDA either)."""
    if sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*"):
        return True
    return cuda_missing() is not None


@functools.cache
def cuda_missing() -> str | None:
    try:
        import torch  # late: heavy, only for gpu tests or on a host with a /dev/nvidia<N>
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA GPU visible to torch (gpu tests need FLA compiled on CUDA)"


@functools.cache
def tpu_missing() -> str | None:
    from kernels_jax.common.platform import on_tpu  # late: jax, only when a tpu test runs

    return None if on_tpu() else "no TPU visible to jax (tpu tests need the Pallas kernels compiled by Mosaic)"
