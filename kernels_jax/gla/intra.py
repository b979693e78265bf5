"""In-kernel math for one GLA chunk: float32 2-D values only (matmuls, masks, elementwise).

Within a chunk of C tokens, with gc = cumsum(g) [C, K] (chunk-local), the intra-chunk
attention is
    A[t, s] = sum_k q[t, k] k[s, k] exp(gc[t, k] - gc[s, k])      s <= t
No exponent taken here is positive where the gates are log-decays (g <= 0):
  * the chunk is split into sub-blocks of SUB = 16 tokens;
  * a block of rows against earlier columns factorises through a reference point r, the
    cumulative gate at the last row before the row block: exp(gc_t - r) * exp(r - gc_s),
    both factors <= 1; the columns at or past the block are masked after a clamped exp;
  * a diagonal SUB x SUB block is taken pair by pair, (t, s) flattened into SUB * SUB rows
    by one-hot selection matmuls, the exponent masked to s <= t before exp.
Every exponent is formed as a short sum of gates (BlockSums: inside a block, then over
block totals), never as the difference of two long cumulative sums, and long contractions
are summed in pieces (kernel_math.dot's `piece`): float32 error at FLA's level or below at chunk 128.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_jax.common.kernel_math import dot as matmul

SUB = 16
LANE_PIECE = 32  # contractions over K, V or the chunk's columns: pieces of 32 terms
_F32 = jnp.float32


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
    return dot_tn(jnp.ones((x.shape[0], 1), _F32), x, SUB)


def lane_sum(x):
    """sum over the columns of x [M, N] -> [M, 1], in pieces of LANE_PIECE columns."""
    return dot(x, jnp.ones((x.shape[1], 1), _F32), LANE_PIECE)


def iota(shape, dim):
    return jax.lax.broadcasted_iota(jnp.int32, shape, dim)


def sub_size(chunk: int) -> int:
    return min(SUB, chunk)


class BlockSums:
    """Row sums of a chunk [C, ...] taken in two levels: inside each sub-block of c rows,
    then over the nb = C / c block totals. Every sum has at most c or nb terms, so a cumulative
    gate has the rounding error of ~c + nb additions, not C (FLA's error or better), and a
    gate difference between nearby tokens is a short sum, never a difference of two long ones.

    loc [C, K]: inclusive cumsum inside each block; tot [nb, K]: each block's total."""

    def __init__(self, C: int):
        c = sub_size(C)
        nb = C // c
        self.c, self.nb, self.C = c, nb, C
        self.shift = c.bit_length() - 1
        t, u = iota((C, C), 0), iota((C, C), 1)
        same = self._blk(t) == self._blk(u)
        self.local_lower = (same & (u <= t)).astype(_F32)
        self.local_upper = (same & (u >= t)).astype(_F32)
        j, u = iota((nb, C), 0), iota((nb, C), 1)
        self.block_end = (u == j * c + (c - 1)).astype(_F32)
        self.block_start = (u == j * c).astype(_F32)

    def _blk(self, t):
        return jax.lax.shift_right_logical(t, self.shift)

    def blocks(self, lo, hi):
        """[C, nb] float32, row t: 1 at blocks m with lo(t) <= m < hi(t); lo, hi: callables of
        the row's block index (int32 [C, nb]) or ints."""
        blk = self._blk(iota((self.C, self.nb), 0))
        m = iota((self.C, self.nb), 1)
        lo = lo(blk) if callable(lo) else lo
        hi = hi(blk) if callable(hi) else hi
        return ((m >= lo) & (m < hi)).astype(_F32)

    def cumsum(self, x):
        """x [C, K] -> (loc, tot, inclusive cumsum [C, K])."""
        loc = dot(self.local_lower, x)
        tot = dot(self.block_end, loc)
        return loc, tot, dot(self.blocks(0, lambda b: b), tot) + loc

    def suffix(self, loc, tot):
        """sum_{u > t} x_u (exclusive reverse cumsum) [C, K] from cumsum's loc and tot."""
        return dot(self.blocks(lambda b: b, self.nb), tot) - loc

    def reverse_cumsum(self, x, rows=None):
        """sum_{u >= t} x_u [C, K], the sum stopping at the end of t's segment of `rows` rows
        (default: the whole chunk)."""
        span = self.nb if rows is None else rows // self.c
        loc = dot(self.local_upper, x)
        tot = dot(self.block_start, loc)
        shift = span.bit_length() - 1  # span: a power of two
        end = lambda b: (jax.lax.shift_right_logical(b, shift) + 1) * span
        return dot(self.blocks(lambda b: b + 1, end), tot) + loc

    def split(self, tot, rows):
        """Totals of the rows before / from row `rows` (a block boundary): ([K, 1], [K, 1])."""
        before = (iota((self.nb, 1), 0) < rows // self.c).astype(_F32)
        return dot_tn(tot, before), dot_tn(tot, 1.0 - before)

    def total(self, tot):
        """sum over the chunk: ([1, K], [K, 1])."""
        ones = jnp.ones((self.nb, 1), _F32)
        return dot_tn(ones, tot), dot_tn(tot, ones)


class PairSelectors:
    """One-hot matrices flattening a c x c block into P = c * c pair rows r = t * c + s.

    rt, rs [P, c]: row r selects token t, resp. s;  rt_t, rs_t [c, P]: their transposes;
    causal [P, 1]: whether s <= t."""

    def __init__(self, c: int):
        shift = c.bit_length() - 1
        P = c * c
        r, j = iota((P, c), 0), iota((P, c), 1)
        self.rt = (jax.lax.shift_right_logical(r, shift) == j).astype(_F32)
        self.rs = ((r & (c - 1)) == j).astype(_F32)
        jt, rt_ = iota((c, P), 0), iota((c, P), 1)
        self.rt_t = (jax.lax.shift_right_logical(rt_, shift) == jt).astype(_F32)
        self.rs_t = ((rt_ & (c - 1)) == jt).astype(_F32)
        rp = iota((P, 1), 0)
        self.causal = jax.lax.shift_right_logical(rp, shift) >= (rp & (c - 1))


def diag_pairs(sel: PairSelectors, q, k, gc):
    """For one diagonal block q, k, gc [c, K] (gc: any cumulative gate, e.g. block-local):
    (e, q_t, k_s) [P, K] with e[r] = exp(gc_t - gc_s) for s <= t (0 otherwise), q_t = q[t], k_s = k[s]."""
    d = dot(sel.rt, gc) - dot(sel.rs, gc)
    e = jnp.where(sel.causal, jnp.exp(jnp.where(sel.causal, d, 0.0)), 0.0)
    return e, dot(sel.rt, q), dot(sel.rs, k)


def block_o(i, sel, sums, q, k, v, loc, tot, qb, kb, vb, lb):
    """Rows of sub-block i of (A masked to s <= t) @ v.

    q, k [C, K], v [C, V]: the whole chunk; loc, tot: BlockSums.cumsum of its gate;
    qb, kb, lb [c, K], vb [c, V]: block i's rows of q, k, loc. -> [c, V]"""
    c, C = qb.shape[0], q.shape[0]
    e, qt, ks = diag_pairs(sel, qb, kb, lb)
    a_pair = lane_sum(qt * ks * e)
    out = dot(dot(sel.rt_t, a_pair * sel.rs), vb)
    # columns s before the block, through the reference r = gc at the row before the block:
    # gc_t - r = loc_t (t in the block), r - gc_s = sum_{s < u < i c} g_u
    to_block = dot(sums.blocks(lambda b: b, i), tot) - loc
    a_prev = dot_nt(qb * jnp.exp(lb), k * jnp.exp(jnp.minimum(to_block, 0.0)), LANE_PIECE)
    return out + dot(jnp.where(iota((c, C), 1) < i * c, a_prev, 0.0), v, LANE_PIECE)


def block_grads(i, sel, sums, q, k, v, do, loc, tot, qb, kb, vb, dob, lb, scale):
    """Gradients of the intra-chunk term scale * (A masked) @ v on the rows of sub-block i.

    Arguments as in block_o, plus do [C, V] and its block dob [c, V].
    Returns dq, dk [c, K], dv [c, V]; dq, dk are the parts through A only (the gradient
    of gc follows from them: q * dq - k * dk)."""
    c, C = qb.shape[0], q.shape[0]
    col = iota((c, C), 1)
    # the diagonal block, pair by pair
    e, qt, ks = diag_pairs(sel, qb, kb, lb)
    a_pair = lane_sum(qt * ks * e)
    da = scale * jnp.where(iota((c, c), 1) <= iota((c, c), 0), dot_nt(dob, vb, LANE_PIECE), 0.0)
    da_pair = jnp.sum(dot(sel.rt, da) * sel.rs, axis=1, keepdims=True)
    w = da_pair * e
    dq = dot(sel.rt_t, w * ks)
    dk = dot(sel.rs_t, w * qt)
    dv = scale * dot(dot(sel.rs_t, a_pair * sel.rt), dob)
    # rows of block i against the columns before it (reference: gc at the row before the block)
    to_block = dot(sums.blocks(lambda b: b, i), tot) - loc
    da_prev = scale * jnp.where(col < i * c, dot_nt(dob, v, LANE_PIECE), 0.0)
    dq = dq + dot(da_prev, k * jnp.exp(jnp.minimum(to_block, 0.0)), LANE_PIECE) * jnp.exp(lb)
    # columns of block i against the rows after it (reference: gc at the block's last row):
    # gc_t - r = sum_{(i+1) c <= u <= t} g_u,  r - gc_s = tot_i - loc_s
    from_block = dot(sums.blocks(i + 1, lambda b: b), tot) + loc
    later = col >= (i + 1) * c
    q_ref = q * jnp.exp(jnp.minimum(from_block, 0.0))
    k_decay = jnp.exp(lb[c - 1 : c] - lb)
    dat_next = scale * jnp.where(later, dot_nt(vb, do, LANE_PIECE), 0.0)
    dk = dk + dot(dat_next, q_ref, LANE_PIECE) * k_decay
    at_next = jnp.where(later, dot_nt(kb * k_decay, q_ref, LANE_PIECE), 0.0)
    dv = dv + scale * dot(at_next, do, LANE_PIECE)
    return dq, dk, dv


def for_each_block(chunk: int, loc_ref, body):
    """Runs body(i, rows, lb) for the sub-blocks i of a chunk (a loop, not unrolled):
    rows: the block's pl.ds; lb [c, K]: its rows of loc (read from the VMEM ref loc_ref)."""
    c = sub_size(chunk)

    def step(i, carry):
        rows = pl.ds(pl.multiple_of(i * c, c), c)
        body(i, rows, loc_ref[rows, :])
        return carry

    jax.lax.fori_loop(0, chunk // c, step, 0)
