"""Kimi Delta Attention (KDA): chunked Pallas TPU kernels, forward and backward."""

import functools

from kernels_jax.common import validation

from .chunk import chunk_kda

check_supported = functools.partial(validation.check_supported, op="kda")

__all__ = ["chunk_kda", "check_supported"]
