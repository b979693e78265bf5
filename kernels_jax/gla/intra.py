"""In-kernel helpers of GLA's kernels (kernels.py), on float32 2-D values: the matmuls (contractions
in pieces of LANE_PIECE or SUB terms), row and lane sums, and the one-hot pair selectors that
take a diagonal SUB x SUB block of a chunk pair by pair (intra-chunk attention, exponents masked
to s <= t before they are taken)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_jax.common.kernel_math import F32
from kernels_jax.common.kernel_math import dot as matmul

SUB = 16
LANE_PIECE = 32  # contractions over K, V or the chunk's columns: pieces of 32 terms


def dot(a, b, piece=None):
    """a [M, L] @ b [L, N] in float32 (kernel_math.dot; contraction in pieces of `piece`)."""
    return matmul(a, b, piece=piece)


def dot_nt(a, b, piece=None):
    """a [M, L] @ b [N, L]^T in float32."""
    return matmul(a, b, trans_b=True, piece=piece)


def dot_tn(a, b, piece=None):
    """a [L, M]^T @ b [L, N] in float32."""
    return matmul(a, b, trans_a=True, piece=piece)


def row_sum(x):
    """sum over the rows of x [C, N] -> [1, N], in pieces of SUB rows."""
    return dot_tn(jnp.ones((x.shape[0], 1), F32), x, SUB)


def lane_sum(x):
    """sum over the columns of x [M, N] -> [M, 1], in pieces of LANE_PIECE columns."""
    return dot(x, jnp.ones((x.shape[1], 1), F32), LANE_PIECE)


def iota(shape, dim):
    return jax.lax.broadcasted_iota(jnp.int32, shape, dim)


def sub_size(chunk: int) -> int:
    return min(SUB, chunk)


class PairSelectors:
    """One-hot matrices flattening a c x c block into P = c * c pair rows r = t * c + s.

    rt, rs [P, c]: row r selects token t, resp. s;  rt_t, rs_t [c, P]: their transposes;
    causal [P, 1]: whether s <= t."""

    def __init__(self, c: int):
        shift = c.bit_length() - 1
        P = c * c
        r, j = iota((P, c), 0), iota((P, c), 1)
        self.rt = (jax.lax.shift_right_logical(r, shift) == j).astype(F32)
        self.rs = ((r & (c - 1)) == j).astype(F32)
        jt, rt_ = iota((c, P), 0), iota((c, P), 1)
        self.rt_t = (jax.lax.shift_right_logical(rt_, shift) == jt).astype(F32)
        self.rs_t = ((rt_ & (c - 1)) == jt).astype(F32)
        rp = iota((P, 1), 0)
        self.causal = jax.lax.shift_right_logical(rp, shift) >= (rp & (c - 1))
