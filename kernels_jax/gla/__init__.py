"""GLA (per-channel log-decay gate) as Pallas TPU kernels: `chunk_gla` (FLA's convention)."""

import functools

from kernels_jax.common import validation

from .chunk import chunk_gla

check_supported = functools.partial(validation.check_supported, op="gla")

__all__ = ["chunk_gla", "check_supported"]
