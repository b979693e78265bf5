"""A library's stage module written part Pallas, part plain JAX, one of whose Pallas stages Mosaic
rejects (tests only: test_stages.py's localise test), under a `pallas:` candidate:

    chunk_local_cumsum   plain JAX (jnp.cumsum), said so with `framework = "jax"`: judged on its
                         numbers and labelled as XLA, never passed as a TPU kernel
    chunk_fwd_h, chunk_bwd_dh, chunk_bwd_dv, chunk_bwd_dqkwg
                         kernels_jax's Pallas stages
    chunk_fwd_o          kernels_jax's, from the copy with mutant bf16-dot-fp32-contract planted:
                         exact in TPU interpret mode, rejected by Mosaic for bfloat16 inputs
    chunk_simple_gla     the op, from that copy
"""

import jax.numpy as jnp

from kernels_jax.simple_gla import stages
from parity.mutants import BY_NAME
from parity.mutants.patched import patched_module

BUG = BY_NAME["bf16-dot-fp32-contract"]


def chunk_local_cumsum(g, chunk_size, scale=None, cu_seqlens=None, **_):
    """g [B, T, H] -> the cumsum within each chunk of chunk_size tokens, times scale."""
    if cu_seqlens is not None:
        raise NotImplementedError("packed sequences are not written")
    B, T, H = g.shape
    n = -(-T // chunk_size) * chunk_size
    x = jnp.pad(g, ((0, 0), (0, n - T), (0, 0))).reshape(B, -1, chunk_size, H)
    return (jnp.cumsum(x, axis=2) * scale).reshape(B, n, H)[:, :T]


chunk_local_cumsum.framework = "jax"
chunk_fwd_h, chunk_bwd_dh, chunk_bwd_dv, chunk_bwd_dqkwg = (
    stages.chunk_fwd_h,
    stages.chunk_bwd_dh,
    stages.chunk_bwd_dv,
    stages.chunk_bwd_dqkwg,
)


def chunk_fwd_o(*args, **kwargs):
    return patched_module(BUG, "kernels_jax.simple_gla.stages").chunk_fwd_o(*args, **kwargs)


def chunk_simple_gla(*args, **kwargs):
    return patched_module(BUG, "kernels_jax.simple_gla").chunk_simple_gla(*args, **kwargs)
