"""GLA (per-channel log-decay gate) as Pallas TPU kernels: `chunk_gla` (FLA's convention)."""
from .chunk import check_supported, chunk_gla

__all__ = ["chunk_gla", "check_supported"]
