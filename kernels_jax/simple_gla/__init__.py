"""Simple GLA Pallas TPU kernels: `chunk_simple_gla` (chunked, any gating) and
`fused_chunk_simple_gla` (g_gamma only: one pallas_call forward, one backward)."""

import functools

from kernels_jax.common import validation

from .chunk import chunk_simple_gla
from .fused import fused_chunk_simple_gla

check_supported = functools.partial(validation.check_supported, op="simple_gla")

__all__ = ["chunk_simple_gla", "fused_chunk_simple_gla", "check_supported"]
