"""Kimi Delta Attention (KDA): chunked Pallas TPU kernels, forward and backward."""
from .chunk import check_supported, chunk_kda

__all__ = ["chunk_kda", "check_supported"]
