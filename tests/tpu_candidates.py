"""Planted user candidates for the TPU compile check (tests only): kernels_jax's Simple GLA
traced with a mutation switch on, as a user's Pallas kernel with that bug would be."""

from kernels_jax.common import mutation
from kernels_jax.simple_gla import chunk_simple_gla


def bf16_fp32_contract(q, k, v, **kw):
    """bf16 x bf16 matmuls asking for float32 contract precision: Mosaic rejects them."""
    with mutation.enabled("bf16_dot_fp32_contract"):
        return chunk_simple_gla(q, k, v, **kw)


def interpret_left_on(q, k, v, **kw):
    """interpret mode hard-coded on: its TPU module holds no Mosaic kernel."""
    with mutation.enabled("interpret_left_on"):
        return chunk_simple_gla(q, k, v, **kw)
