"""GLA's chunk stages (FLA 0.6.0's split of chunk_gla) as Pallas TPU kernels, one per stage: the
op's kernels (chunk.py calls them in order) and its stage cases' (stages.py).

Every kernel runs on the packed layout of common/layout.py: tokens [H, NT * C, D] (K, V padded
to multiples of ALIGN), per-chunk squares A, dA [H, NT * C, C] (row: the token, column: the
position in its chunk), states [H, NT, K, V] (one per chunk) or [N, H, K, V] (one per sequence,
through the scalar-prefetched `seq` table). Grid (H, NT), whole K and V per block; the
state-passing kernels (fwd_h, bwd_dh) carry the state in float32 VMEM scratch along an
"arbitrary" chunk axis, the others are "parallel" in both.

Gates g [C, K] arrive in FLA's log2 units, already the chunk-local cumsum (non-increasing down
the chunk; a padding slot repeats its chunk's last real gate, so slot C - 1 holds the chunk's
total). No exponent formed here is positive:
  * to and from the chunk's ends: exp2(g_t), exp2(g_last - g_t);
  * inside the chunk, for rows of sub-block i (SUB = 16 rows) against earlier columns, through
    FLA's reference point, a row of the gates: exp2(g_t - g_ref) * exp2(min(g_ref - g_s, 0)),
    columns at or past the reference masked after the clamped exp;
  * a diagonal SUB x SUB block pair by pair (intra.PairSelectors), the exponent masked to
    s <= t before exp2.
Contractions are float32 (kernel_math.dot: HIGHEST for float32 operands, one bf16 pass for two
bf16 ones), long ones summed in pieces of LANE_PIECE.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common.kernel_math import F32, advance_state, params
from kernels_jax.common.platform import interpret_mode

from . import intra
from .intra import LANE_PIECE, PairSelectors, dot, dot_nt, dot_tn, iota, sub_size

ALIGN = intra.LANE_PIECE  # head dims padded to whole pieces of the contractions


# ---------------------------------------------------------------- in-kernel helpers


def _load(ref, rows=None):
    return (ref[...] if rows is None else ref[rows, :]).astype(F32)


def _last(g):
    """The chunk's last gate row of g [C, K]: ([1, K], [K, 1]) (the column by a one-hot matmul,
    exact)."""
    C = g.shape[0]
    pick = (iota((C, 1), 0) == C - 1).astype(F32)
    return g[C - 1 : C, :], dot_tn(g, pick)


def _place(i: int, c: int, C: int):
    """[c, C] one-hot: row j -> column i * c + j (a diagonal block's columns in the chunk)."""
    return (iota((c, C), 1) == iota((c, C), 0) + i * c).astype(F32)


def _diag_pairs(sel: PairSelectors, qb, kb, gb):
    """For a diagonal block qb, kb, gb [c, K]: (e, q_t, k_s) [P, K], pair r = t * c + s,
    e = exp2(g_t - g_s) for s <= t (exponent masked before exp2), else 0."""
    d = dot(sel.rt, gb) - dot(sel.rs, gb)
    e = jnp.where(sel.causal, jnp.exp2(jnp.where(sel.causal, d, 0.0)), 0.0)
    return e, dot(sel.rt, qb), dot(sel.rs, kb)


def _pairs_to_square(sel: PairSelectors, x):
    """[P, 1] pair values -> the [c, c] block, entry (t, s) = x[t * c + s]."""
    return dot(sel.rt_t, x * sel.rs)


def _square_to_pairs(sel: PairSelectors, blk):
    """[c, c] block -> [P, 1], row t * c + s = blk[t, s]."""
    return jnp.sum(dot(sel.rt, blk) * sel.rs, axis=1, keepdims=True)


# ---------------------------------------------------------------- kernels


def _fwd_h_kernel(seq_ref, first_ref, last_ref, k_ref, v_ref, g_ref, h0_ref, h_ref, ht_ref, state_ref):
    """One (head, chunk): k, g [C, K]; v [C, V]; h0, ht (the sequence's), h (this chunk's) [K, V].
    h = the state before the chunk; S_next = exp2(g_last) * S + (k * exp2(g_last - g))^T v."""
    t = pl.program_id(1)

    @pl.when(first_ref[t] == 1)
    def load_initial_state():
        state_ref[...] = h0_ref[...].astype(F32)

    S = state_ref[...]
    h_ref[...] = S
    k, v, g = _load(k_ref), _load(v_ref), _load(g_ref)
    g_row, g_col = _last(g)
    S = advance_state(S, k, v, jnp.exp2(g_col), jnp.exp2(g_row - g), piece=intra.SUB)
    state_ref[...] = S
    ht_ref[...] = S


def _bwd_dh_kernel(seq_ref, first_ref, last_ref, q_ref, do_ref, g_ref, dht_ref, dh_ref, dh0_ref, dstate_ref, *, scale):
    """One (head, chunk), chunks in reverse: q, g [C, K]; do [C, V]; dht, dh0 (the sequence's),
    dh (this chunk's) [K, V]. dh = the gradient of the state after the chunk;
    dS_prev = exp2(g_last) * dS + scale (q * exp2(g))^T do."""
    t = pl.num_programs(1) - 1 - pl.program_id(1)

    @pl.when(last_ref[t] == 1)
    def load_final_state_grad():
        dstate_ref[...] = dht_ref[...].astype(F32)

    dS = dstate_ref[...]
    dh_ref[...] = dS
    q, do, g = _load(q_ref), _load(do_ref), _load(g_ref)
    _, g_col = _last(g)
    dS = jnp.exp2(g_col) * dS + scale * dot_tn(q * jnp.exp2(g), do, LANE_PIECE)
    dstate_ref[...] = dS
    dh0_ref[...] = dS


def _fwd_intra_kernel(q_ref, k_ref, g_ref, a_ref, *, scale):
    """One (head, chunk): q, k, g [C, K] -> A [C, C]: scale sum_k q_tk k_sk exp2(g_tk - g_sk) for
    s <= t, else 0; by row blocks of c = SUB rows."""
    C = q_ref.shape[0]
    c = sub_size(C)
    sel = PairSelectors(c)
    k, g = _load(k_ref), _load(g_ref)
    for i in range(C // c):
        rows = pl.ds(i * c, c)
        qb, kb, gb = _load(q_ref, rows), _load(k_ref, rows), _load(g_ref, rows)
        e, qt, ks = _diag_pairs(sel, qb, kb, gb)
        a = dot(_pairs_to_square(sel, intra.lane_sum(qt * ks * e)), _place(i, c, C))
        if i > 0:  # columns before the block, through the reference g at its first row
            ref = gb[0:1, :]
            a_prev = dot_nt(qb * jnp.exp2(gb - ref), k * jnp.exp2(jnp.minimum(ref - g, 0.0)), LANE_PIECE)
            a = a + jnp.where(iota((c, C), 1) < i * c, a_prev, 0.0)
        a_ref[rows, :] = scale * a


def _fwd_o_kernel(q_ref, v_ref, g_ref, a_ref, h_ref, o_ref, *, scale):
    """One (head, chunk): q, g [C, K]; v [C, V]; A [C, C] (s <= t read); h [K, V] the state
    before the chunk -> o = scale (q * exp2(g)) h + tril(A) v [C, V]."""
    C = q_ref.shape[0]
    q, v, g, h = _load(q_ref), _load(v_ref), _load(g_ref), _load(h_ref)
    a = jnp.where(iota((C, C), 1) <= iota((C, C), 0), _load(a_ref), 0.0)
    o = scale * dot(q * jnp.exp2(g), h, LANE_PIECE) + dot(a, v, LANE_PIECE)
    o_ref[...] = o.astype(o_ref.dtype)


def _bwd_dv_kernel(k_ref, g_ref, a_ref, do_ref, dh_ref, dv_ref):
    """One (head, chunk): k, g [C, K]; A [C, C]; do [C, V]; dh [K, V] the gradient of the state
    after the chunk -> dv = tril(A)^T do + (k * exp2(g_last - g)) dh [C, V]."""
    C = k_ref.shape[0]
    k, g, do, dh = _load(k_ref), _load(g_ref), _load(do_ref), _load(dh_ref)
    a = jnp.where(iota((C, C), 1) <= iota((C, C), 0), _load(a_ref), 0.0)
    g_row, _ = _last(g)
    dv = dot_tn(a, do, LANE_PIECE) + dot(k * jnp.exp2(g_row - g), dh, LANE_PIECE)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _bwd_da_kernel(v_ref, do_ref, da_ref, *, scale):
    """One (head, chunk): v, do [C, V] -> dA = scale do v^T for s <= t, else 0 [C, C]."""
    C = v_ref.shape[0]
    da = scale * dot_nt(_load(do_ref), _load(v_ref), LANE_PIECE)
    da_ref[...] = jnp.where(iota((C, C), 1) <= iota((C, C), 0), da, 0.0)


def _bwd_dqk_intra_kernel(q_ref, k_ref, g_ref, da_ref, dq_ref, dk_ref):
    """One (head, chunk): q, k, g [C, K]; dA [C, C] (s <= t read) -> dq, dk [C, K] float32:
    dq_t = sum_{s<=t} dA_ts k_s exp2(g_t - g_s), dk_s = sum_{t>=s} dA_ts q_t exp2(g_t - g_s).
    Row block i: its dq rows (earlier columns through the reference g at its first row) and its
    dk rows (later rows through the reference g at its last row), and the diagonal block."""
    C = q_ref.shape[0]
    c = sub_size(C)
    nb = C // c
    sel = PairSelectors(c)
    q, k, g = _load(q_ref), _load(k_ref), _load(g_ref)
    da = jnp.where(iota((C, C), 1) <= iota((C, C), 0), _load(da_ref), 0.0)
    for i in range(nb):
        rows = pl.ds(i * c, c)
        qb, kb, gb, da_rows = _load(q_ref, rows), _load(k_ref, rows), _load(g_ref, rows), da[i * c : (i + 1) * c, :]
        place = _place(i, c, C)
        e, qt, ks = _diag_pairs(sel, qb, kb, gb)
        w = _square_to_pairs(sel, dot_nt(da_rows, place)) * e
        dq = dot(sel.rt_t, w * ks)
        dk = dot(sel.rs_t, w * qt)
        if i > 0:
            ref = gb[0:1, :]
            da_prev = jnp.where(iota((c, C), 1) < i * c, da_rows, 0.0)
            dq = dq + dot(da_prev, k * jnp.exp2(jnp.minimum(ref - g, 0.0)), LANE_PIECE) * jnp.exp2(gb - ref)
        if i < nb - 1:
            ref = gb[c - 1 : c, :]
            da_next = jnp.where(iota((C, c), 0) >= (i + 1) * c, dot_nt(da, place), 0.0)  # [C(t), c(s)]
            dk = dk + dot_tn(da_next, q * jnp.exp2(jnp.minimum(g - ref, 0.0)), LANE_PIECE) * jnp.exp2(ref - gb)
        dq_ref[rows, :] = dq
        dk_ref[rows, :] = dk


def _bwd_dqkg_kernel(
    q_ref, k_ref, v_ref, h_ref, g_ref, do_ref, dh_ref, dqi_ref, dki_ref, dq_ref, dk_ref, dg_ref, *, scale
):
    """One (head, chunk): q, k, g, dq_intra, dk_intra [C, K]; v, do [C, V]; h (the state before
    the chunk), dh (the gradient of the state after it) [K, V] -> dq, dk (whole), dg [C, K]:
        dq = scale exp2(g) * (do h^T) + dq_intra,  dk = exp2(g_last - g) * (v dh^T) + dk_intra
        dg_t = sum_{u >= t} (q_u dq_u - k_u dk_u) + exp2(g_last) sum_V(h * dh) + sum_s k_s dk_state_s
    (the gradient of the op's raw g; padding rows hold q = k = 0)."""
    C, V = v_ref.shape
    q, k, v, g, do = _load(q_ref), _load(k_ref), _load(v_ref), _load(g_ref), _load(do_ref)
    h, dh = _load(h_ref), _load(dh_ref)
    g_row, _ = _last(g)
    dq = scale * jnp.exp2(g) * dot_nt(do, h, LANE_PIECE) + _load(dqi_ref)
    dk_state = jnp.exp2(g_row - g) * dot_nt(v, dh, LANE_PIECE)
    dk = dk_state + _load(dki_ref)
    dgk = jnp.exp2(g_row) * dot_nt(jnp.ones((1, V), F32), h * dh, LANE_PIECE) + intra.row_sum(k * dk_state)
    upper = (iota((C, C), 1) >= iota((C, C), 0)).astype(F32)  # [t, u]: u >= t
    dg = dot(upper, q * dq - k * dk, intra.SUB) + dgk
    dq_ref[...] = dq
    dk_ref[...] = dk
    dg_ref[...] = dg


# ---------------------------------------------------------------- pallas calls


def _tok(C: int, D: int, rev: bool = False, NT: int = 0):
    """BlockSpec of a token tensor [H, NT * C, D] (chunks in reverse with rev)."""
    if rev:
        return pl.BlockSpec((None, C, D), lambda h, t, *_: (h, NT - 1 - t, 0))
    return pl.BlockSpec((None, C, D), lambda h, t, *_: (h, t, 0))


def _call(kernel, name, grid, in_specs, out_specs, out_shape, semantics, *args, scratch=(), prefetch=0):
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=prefetch, grid=grid, in_specs=in_specs, out_specs=out_specs, scratch_shapes=list(scratch)
    )
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=out_shape,
        compiler_params=params(*semantics),
        interpret=interpret_mode(),
        name=name,
    )(*args)


def _states(K: int, V: int, NT: int, rev: bool = False):
    """BlockSpecs of the states [H, NT, K, V] (one per chunk) and [N, H, K, V] (the chunk's
    sequence's, through the `seq` table), chunks in reverse with rev."""

    def chunk(t):
        return NT - 1 - t if rev else t

    return (
        pl.BlockSpec((None, None, K, V), lambda h, t, *_: (h, chunk(t), 0, 0)),
        pl.BlockSpec((None, None, K, V), lambda h, t, seq, *_: (seq[chunk(t)], h, 0, 0)),
    )


def fwd_h(k, v, g, h0, tables, NT: int, C: int):
    """Packed k, g [H, NT * C, K], v [H, NT * C, V], h0 [N, H, K, V] float32 ->
    (h [H, NT, K, V] float32: the state before each chunk, ht [N, H, K, V]: each sequence's last)."""
    H, _, K = k.shape
    V, N = v.shape[2], h0.shape[0]
    chunk_state, seq_state = _states(K, V, NT)
    return _call(
        _fwd_h_kernel,
        "gla_chunk_fwd_h",
        (H, NT),
        [_tok(C, K), _tok(C, V), _tok(C, K), seq_state],
        [chunk_state, seq_state],
        [jax.ShapeDtypeStruct((H, NT, K, V), F32), jax.ShapeDtypeStruct((N, H, K, V), F32)],
        ("parallel", "arbitrary"),
        *tables,
        k,
        v,
        g,
        h0,
        scratch=[pltpu.VMEM((K, V), F32)],
        prefetch=3,
    )


def bwd_dh(q, do, g, dht, tables, NT: int, C: int, scale: float):
    """Packed q, g [H, NT * C, K], do [H, NT * C, V], dht [N, H, K, V] float32 ->
    (dh [H, NT, K, V] float32: the gradient of the state after each chunk, dh0 [N, H, K, V])."""
    H, _, K = q.shape
    V, N = do.shape[2], dht.shape[0]
    chunk_state, seq_state = _states(K, V, NT, rev=True)
    return _call(
        functools.partial(_bwd_dh_kernel, scale=scale),
        "gla_chunk_bwd_dh",
        (H, NT),
        [_tok(C, K, True, NT), _tok(C, V, True, NT), _tok(C, K, True, NT), seq_state],
        [chunk_state, seq_state],
        [jax.ShapeDtypeStruct((H, NT, K, V), F32), jax.ShapeDtypeStruct((N, H, K, V), F32)],
        ("parallel", "arbitrary"),
        *tables,
        q,
        do,
        g,
        dht,
        scratch=[pltpu.VMEM((K, V), F32)],
        prefetch=3,
    )


def fwd_intra(q, k, g, NT: int, C: int, scale: float):
    """Packed q, k, g [H, NT * C, K] -> A [H, NT * C, C] float32."""
    H, _, K = q.shape
    return _call(
        functools.partial(_fwd_intra_kernel, scale=scale),
        "gla_chunk_fwd_intra",
        (H, NT),
        [_tok(C, K)] * 3,
        _tok(C, C),
        jax.ShapeDtypeStruct((H, NT * C, C), F32),
        ("parallel", "parallel"),
        q,
        k,
        g,
    )


def fwd_o(q, v, g, A, h, NT: int, C: int, scale: float, o_dtype):
    """Packed q, g [H, NT * C, K], v [H, NT * C, V], A [H, NT * C, C], h [H, NT, K, V] ->
    o [H, NT * C, V] in o_dtype."""
    H, _, K = q.shape
    V = v.shape[2]
    return _call(
        functools.partial(_fwd_o_kernel, scale=scale),
        "gla_chunk_fwd_o",
        (H, NT),
        [_tok(C, K), _tok(C, V), _tok(C, K), _tok(C, C), _states(K, V, NT)[0]],
        _tok(C, V),
        jax.ShapeDtypeStruct((H, NT * C, V), o_dtype),
        ("parallel", "parallel"),
        q,
        v,
        g,
        A,
        h,
    )


def bwd_dv(k, g, A, do, dh, NT: int, C: int, dv_dtype):
    """Packed k, g [H, NT * C, K], A [H, NT * C, C], do [H, NT * C, V], dh [H, NT, K, V] ->
    dv [H, NT * C, V] in dv_dtype."""
    H, _, K = k.shape
    V = do.shape[2]
    return _call(
        _bwd_dv_kernel,
        "gla_chunk_bwd_dv",
        (H, NT),
        [_tok(C, K), _tok(C, K), _tok(C, C), _tok(C, V), _states(K, V, NT)[0]],
        _tok(C, V),
        jax.ShapeDtypeStruct((H, NT * C, V), dv_dtype),
        ("parallel", "parallel"),
        k,
        g,
        A,
        do,
        dh,
    )


def bwd_da(v, do, NT: int, C: int, scale: float):
    """Packed v, do [H, NT * C, V] -> dA [H, NT * C, C] float32."""
    H, _, V = v.shape
    return _call(
        functools.partial(_bwd_da_kernel, scale=scale),
        "gla_chunk_bwd_da",
        (H, NT),
        [_tok(C, V), _tok(C, V)],
        _tok(C, C),
        jax.ShapeDtypeStruct((H, NT * C, C), F32),
        ("parallel", "parallel"),
        v,
        do,
    )


def bwd_dqk_intra(q, k, g, dA, NT: int, C: int):
    """Packed q, k, g [H, NT * C, K], dA [H, NT * C, C] -> dq, dk [H, NT * C, K] float32."""
    H, _, K = q.shape
    out = jax.ShapeDtypeStruct((H, NT * C, K), F32)
    return _call(
        _bwd_dqk_intra_kernel,
        "gla_chunk_bwd_dqk_intra",
        (H, NT),
        [_tok(C, K)] * 3 + [_tok(C, C)],
        [_tok(C, K)] * 2,
        [out, out],
        ("parallel", "parallel"),
        q,
        k,
        g,
        dA,
    )


def bwd_dqkg(q, k, v, h, g, do, dh, dq, dk, NT: int, C: int, scale: float):
    """Packed q, k, g, dq, dk [H, NT * C, K], v, do [H, NT * C, V], h, dh [H, NT, K, V] ->
    dq, dk, dg [H, NT * C, K] float32."""
    H, _, K = q.shape
    V = v.shape[2]
    state = _states(K, V, NT)[0]
    out = jax.ShapeDtypeStruct((H, NT * C, K), F32)
    return _call(
        functools.partial(_bwd_dqkg_kernel, scale=scale),
        "gla_chunk_bwd_dqkg",
        (H, NT),
        [_tok(C, K), _tok(C, K), _tok(C, V), state, _tok(C, K), _tok(C, V), state, _tok(C, K), _tok(C, K)],
        [_tok(C, K)] * 3,
        [out, out, out],
        ("parallel", "parallel"),
        q,
        k,
        v,
        h,
        g,
        do,
        dh,
        dq,
        dk,
    )
