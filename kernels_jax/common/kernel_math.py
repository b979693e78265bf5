"""In-kernel helpers shared by every kernel: the matmul, the state-passing stages, safe decay
matrices and the compiler parameters.

Safe decays: a log-decay cumulative sum b is non-increasing inside a chunk, so
exp(b_i - b_j) <= 1 for i >= j, while the upper triangle (i < j) can overflow float32
once |g| * chunk_size > 88.7 (the bug classes masked-exp-overflow and split-decay-overflow).
`causal_decay` masks the exponent before exp, never the product after it (inf * 0 = NaN).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import tpu as pltpu

F32 = jnp.float32


def dot(a, b, *, trans_a: bool = False, trans_b: bool = False, piece: int | None = None):
    """a @ b (a^T / b^T when asked) with a float32 accumulator, the one matmul of every kernel.

    Operand precision, by operand dtype (what the MXU does with it, on every TPU generation):
      bf16 x bf16: one MXU pass at DEFAULT precision; the products of two bfloat16 numbers are
        exact in float32, so nothing is lost (and Mosaic rejects a bf16 matmul that asks for
        float32 contract precision: "Bad lhs type" on v5e, v6e and TPU7x);
      anything else: both operands in float32 at HIGHEST (six bf16 passes, about float32
        accuracy); DEFAULT would round each float32 operand to bfloat16 (one pass, ~2e-3
        relative error: less accurate than FLA's TF32 on a GPU).
    piece: a contraction longer than `piece` is summed in two levels (pieces of `piece` terms,
    then the partial products), which keeps float32 accumulation error at FLA's level (its
    tiles are 16 to 64 wide) for long contractions."""
    ca, cb = (0 if trans_a else 1), (1 if trans_b else 0)
    dims = (((ca,), (cb,)), ((), ()))
    if a.dtype == b.dtype == jnp.bfloat16:
        precision = None
    else:
        a, b = a.astype(F32), b.astype(F32)
        precision = lax.Precision.HIGHEST
    length = a.shape[ca]
    if piece is None or length <= piece:
        return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=F32)
    out = None
    for start in range(0, length, piece):
        stop = min(start + piece, length)
        part = lax.dot_general(
            lax.slice_in_dim(a, start, stop, axis=ca),
            lax.slice_in_dim(b, start, stop, axis=cb),
            dims,
            precision=precision,
            preferred_element_type=F32,
        )
        out = part if out is None else out + part
    return out


def advance_state(S, k, v, decay_chunk, decay_to_end, piece: int | None = None):
    """The state after one chunk, S [K, V] -> decay_chunk * S + (k * decay_to_end)^T v.

    k [C, K]; v [C, V]; decay_chunk: the decay over the whole chunk, [1, 1] (a scalar gate) or
    [K, 1] (per channel); decay_to_end: from each token to the chunk's end, [C, 1] or [C, K].
    The state-passing stage of Simple GLA and GLA alike (FLA's chunk_fwd_h)."""
    return decay_chunk * S + dot(k * decay_to_end, v, trans_a=True, piece=piece)


def state_grad_step(dS, q, do, decay_chunk, decay_from_start, scale: float, piece: int | None = None):
    """The state gradient one chunk earlier, dS [K, V] -> decay_chunk * dS + scale (q * decay_from_start)^T do.

    q [C, K]; do [C, V]; decay_chunk as in advance_state; decay_from_start: from the chunk's
    start to each token, [C, 1] or [C, K] (FLA's chunk_bwd_dh)."""
    return decay_chunk * dS + scale * dot(q * decay_from_start, do, trans_a=True, piece=piece)


def causal_decay(b_col, b_row, *, transpose: bool = False, gamma=None):
    """[C, C] float32 decay D[i, j] = exp(b_i - b_j) for i >= j, else 0 (masked before exp).

    b_col [C, 1] and b_row [1, C] hold the same chunk-local cumulative log-decay; or, with
    gamma given, step counts m so that b = gamma * m and b_i - b_j = gamma * (m_i - m_j) is
    rounded once (not the difference of two rounded large numbers).
    transpose: D^T, i.e. D[j, i] = exp(b_i - b_j) for i >= j, built from the same inputs
    (rows indexed by j)."""
    C = b_col.shape[0]
    row = lax.broadcasted_iota(jnp.int32, (C, C), 0)
    col = lax.broadcasted_iota(jnp.int32, (C, C), 1)
    if transpose:  # entry [r, c] = exp(b_c - b_r) for c >= r
        keep = col >= row
        diff = b_row - b_col
    else:  # entry [r, c] = exp(b_r - b_c) for r >= c
        keep = row >= col
        diff = b_col - b_row
    if gamma is not None:
        diff = gamma * diff
    return jnp.exp(jnp.where(keep, diff, -jnp.inf))


def row_sum(x):
    """[R, D] -> [R, 1]."""
    return jnp.sum(x, axis=1, keepdims=True)


def total(x):
    """[R, D] -> [1, 1]."""
    return jnp.sum(row_sum(x), axis=0, keepdims=True)


def params(*semantics: str):
    """pltpu.CompilerParams with these dimension semantics ('parallel' / 'arbitrary').

    A grid axis along which a kernel carries state in scratch must be 'arbitrary': a TPU with
    two TensorCores (v4, v5p, TPU7x) splits 'parallel' axes between them, and TPU interpret
    mode gives each 'parallel' iteration a fresh (NaN-filled) scratch."""
    return pltpu.CompilerParams(dimension_semantics=semantics)
