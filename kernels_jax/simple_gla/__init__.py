"""Simple GLA Pallas TPU kernels: `chunk_simple_gla` (chunked, any gating) and
`fused_chunk_simple_gla` (g_gamma only: one pallas_call forward, one backward)."""
from kernels_jax.common.validation import simple_gla_supported as check_supported

from .chunk import chunk_simple_gla
from .fused import fused_chunk_simple_gla

__all__ = ["chunk_simple_gla", "fused_chunk_simple_gla", "check_supported"]
