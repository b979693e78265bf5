"""GLA (per-channel log-decay gate) as Pallas TPU kernels: `chunk_gla` (FLA's convention)."""
from .chunk import chunk_gla

__all__ = ["chunk_gla"]
