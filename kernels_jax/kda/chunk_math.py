"""Per-chunk delta-rule math on VMEM values: the helpers of KDA's and GDN's kernels (iota, transpose,
the unit lower inverse, masks, loops) and GDN-2's WY form (kernels_jax/gdn2/kernels.py).

Everything here is float32, 2-D and built from matmuls, iota masks, exp, where and
reductions, so it lowers to Mosaic. One chunk of C tokens, K key channels, V value channels:

    G      [C, K]  chunk-local cumulative log-decay, G_i = sum_{t<=i} g_t (exponents below
                   written as G differences are computed as sums of g over the interval)
    A_kk   [C, C]  A_kk[i, j] = sum_c k_i[c] k_j[c] exp(G_i[c] - G_j[c])   for j < i
    A_qk   [C, C]  A_qk[i, j] = sum_c q_i[c] k_j[c] exp(G_i[c] - G_j[c])   for j <= i
    Inv    [C, C]  (I + diag(beta) A_kk)^-1 by forward substitution
    W      [C, K]  Inv @ (beta * k * exp(G))       (WY effective keys)
    U      [C, V]  Inv @ (beta * v)                (WY effective values)
GDN-2 (channel-wise erase gate b [C, K], write gate w [C, V]) builds A_kk from the keys b * k
(A_kk[i, j] = sum_c b_i[c] k_i[c] k_j[c] exp(G_i[c] - G_j[c])), Inv = (I + A_kk)^-1,
W = Inv @ (b * k * exp(G)), U = Inv @ (w * v).

Decays: every exponent is the sum of g over a token interval, computed directly as
(interval indicator matrix) @ g: G_i - G_j = sum_{j<t<=i} g_t for i >= j, the sums either side of
a sub-block boundary r, and the suffix sums G_last - G_i. Empty intervals give exp(0) = 1 and are
masked after, so the mask is part of the exponent. For log-decays g <= 0 every exponent is <= 0:
nothing overflows however far the cumulative decay inside a chunk goes past the float32 exp
range (masked-exp-overflow). Interval sums do not suffer the cancellation of G_i - G_j for large
|G|, so decays near the end of a long, steep chunk keep full float32 accuracy.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels_jax.common.kernel_math import F32, dot

SUB = 16  # sub-chunk size: off-diagonal sub-blocks use matmuls, diagonal ones exact elementwise decay


def iota(shape, dim):
    return lax.broadcasted_iota(jnp.int32, shape, dim)


def eye(n):
    return (iota((n, n), 0) == iota((n, n), 1)).astype(F32)


def transpose(x):
    """x^T for x [R, C], as an exact identity matmul (I [C, C] contracted with x's columns)."""
    return dot(eye(x.shape[1]), x, trans_b=True)


def interval_sums(g, starts, ends):
    """sum_{starts[i] < t <= ends[i]} g_t for each row i (0 for an empty interval).
    g [C, K]; starts, ends int32 [C, 1] -> [C, K], as a 0/1 matrix @ g."""
    t = iota((g.shape[0], g.shape[0]), 1)
    return dot(((t > starts) & (t <= ends)).astype(F32), g)


def chunk_cumsum(g):
    """G_i = sum_{t<=i} g_t. g [C, K] -> [C, K]."""
    i = iota((g.shape[0], 1), 0)
    return interval_sums(g, jnp.full_like(i, -1), i)


def reverse_cumsum(dG):
    """dg_t = sum_{i>=t} dG_i (the transpose of chunk_cumsum). [C, K] -> [C, K]."""
    C = dG.shape[0]
    return dot((iota((C, C), 0) <= iota((C, C), 1)).astype(F32), dG)


def row_sums(x):
    """sum over columns of x [R, N] -> [R, 1]."""
    return jnp.sum(x, axis=1, keepdims=True)


def fori(lower: int, upper: int, body, init):
    """lax.fori_loop whose trip count XLA cannot see (upper + 0 * program_id): in TPU interpret
    mode XLA would otherwise unroll the loop and compile for many seconds. Kernel bodies only."""
    return lax.fori_loop(lower, upper + 0 * pl.program_id(0), body, init)


def _same_sub_block_column(g, offset):
    """For column j = i - i % SUB + offset of row i's own sub-block: (select [C, C] with
    select[i, j] = 1, rows_ok [C, 1] marking j <= i, exp(sum_{j<t<=i} g_t) [C, K])."""
    C = g.shape[0]
    rows, cols = iota((C, C), 0), iota((C, C), 1)
    select = (cols == rows - rows % SUB + offset).astype(F32)
    i = iota((C, 1), 0)
    j = i - i % SUB + offset
    return select, j <= i, jnp.exp(interval_sums(g, j, i))


def _earlier_sub_blocks(g):
    """For each row sub-block starting at r > 0: (r, exp(sum_{r<t<=i} g_t) [SUB, K] for its rows
    i, exp(sum_{j<t<=r} g_t) [C, K] for rows j < r (1 elsewhere), mask of columns < r [SUB, C])."""
    C = g.shape[0]
    i = iota((C, 1), 0)
    for r in range(SUB, C, SUB):
        to_row = jnp.exp(interval_sums(g, jnp.full_like(i, r), i)[r : r + SUB])
        from_row = jnp.exp(interval_sums(g, i, jnp.full_like(i, r)))
        yield r, to_row, from_row, iota((SUB, C), 1) < r


def decayed_products(xs, y, g):
    """For each x in xs: P[i, j] = sum_c x_i[c] y_j[c] exp(G_i[c] - G_j[c]) for j <= i, else 0.

    xs: tuple of [C, K]; y, g [C, K] -> tuple of P [C, C]. Row sub-block a (rows r..r+SUB) against
    earlier columns j < r: (x_a exp(G_a - G_r)) @ (y_j exp(G_r - G_j))^T; inside the diagonal
    sub-blocks, one column offset at a time for all sub-blocks at once.
    """
    C = y.shape[0]

    def diagonal(offset, Ps):
        select, rows_ok, decay = _same_sub_block_column(g, offset)
        y_decayed = decay * dot(select, y)  # y_j exp(G_i - G_j), j in i's sub-block
        return tuple(P + select * jnp.where(rows_ok, row_sums(x * y_decayed), 0.0) for x, P in zip(xs, Ps))

    Ps = fori(0, SUB, diagonal, tuple(jnp.zeros((C, C), F32) for _ in xs))
    blocks = [[P[:SUB]] for P in Ps]
    for r, to_row, from_row, left in _earlier_sub_blocks(g):
        y_ref = y * from_row
        for x, P, rows in zip(xs, Ps, blocks):
            rows.append(P[r : r + SUB] + jnp.where(left, dot(x[r : r + SUB] * to_row, y_ref, trans_b=True), 0.0))
    return tuple(jnp.concatenate(rows, axis=0) for rows in blocks)


def decayed_products_grad(dPs, xs, y, g):
    """Gradients of decayed_products for cotangents dPs (tuple of [C, C], zero above the
    diagonal): (tuple of dx [C, K], dy [C, K]). dG follows: sum over xs of x * dx, minus y * dy."""
    C, K = y.shape

    def diagonal(offset, grads):
        dxs, dy = grads
        select, rows_ok, decay = _same_sub_block_column(g, offset)
        y_col = dot(select, y)
        new_dxs, dy_rows = [], jnp.zeros((C, K), F32)
        for dP, x, dx in zip(dPs, xs, dxs):
            dP_col = jnp.where(rows_ok, row_sums(select * dP), 0.0) * decay
            new_dxs.append(dx + dP_col * y_col)
            dy_rows = dy_rows + dP_col * x
        return tuple(new_dxs), dy + dot(select, dy_rows, trans_a=True)

    zeros = jnp.zeros((C, K), F32)
    dxs, dy = fori(0, SUB, diagonal, (tuple(zeros for _ in xs), zeros))
    blocks = [[dx[:SUB]] for dx in dxs]
    for r, to_row, from_row, left in _earlier_sub_blocks(g):
        y_ref = y * from_row
        for dP, x, dx, rows in zip(dPs, xs, dxs, blocks):
            dP_left = jnp.where(left, dP[r : r + SUB], 0.0)
            rows.append(dx[r : r + SUB] + to_row * dot(dP_left, y_ref))
            dy = dy + from_row * dot(dP_left, x[r : r + SUB] * to_row, trans_a=True)
    return tuple(jnp.concatenate(rows, axis=0) for rows in blocks), dy


def unit_lower_inverse(N):
    """(I + N)^-1 for N [C, C] strictly lower triangular, by forward substitution (row i of the
    inverse is e_i - sum_{j<i} N[i, j] row_j), in float32 vector ops."""
    C = N.shape[0]
    NT = transpose(N)  # column i of NT is row i of N
    cols = iota((C, C), 1)
    rows = iota((C, C), 0)

    def substitute(i, inv):
        coef = row_sums(jnp.where(cols == i, NT, 0.0))  # [C, 1]: N[i, j] at row j
        row = jnp.sum(coef * inv, axis=0, keepdims=True)  # [1, C]
        return inv - jnp.where(rows == i, row, 0.0)

    return fori(1, C, substitute, eye(C))


def causal_mask(C, strict: bool):
    r, c = iota((C, C), 0), iota((C, C), 1)
    return r > c if strict else r >= c


def wy_factors(A_kk, k, decay, erase):
    """(Inv, X) with Inv = (I + A_kk)^-1 and X = erase * k * exp(G), so that W = Inv @ X. A_kk
    [C, C] strictly lower, built from the keys b * k; k, decay = exp(G), erase (GDN-2's b) [C, K]."""
    return unit_lower_inverse(A_kk), erase * k * decay


def chunk_decays(g):
    """(exp(G) [C, K], exp(G_last) [1, K], exp(G_last - G) [C, K]) for g [C, K]: decay from the
    chunk start, over the whole chunk, and from each token to the chunk end (suffix sums)."""
    C = g.shape[0]
    i = iota((C, 1), 0)
    decay = jnp.exp(chunk_cumsum(g))
    return decay, decay[C - 1 :], jnp.exp(interval_sums(g, i, jnp.full_like(i, C - 1)))
