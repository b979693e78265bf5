"""Kimi Delta Attention (KDA): chunked Pallas TPU kernels, forward and backward."""
from .chunk import chunk_kda

__all__ = ["chunk_kda"]
