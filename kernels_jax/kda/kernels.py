"""KDA's chunk stages (FLA 0.6.0's split of chunk_kda) as Pallas TPU kernels, one per stage: the op's
kernels (chunk.py calls them in FLA's order) and its stage cases' (stages.py adapts FLA's calling
convention to them).

Layout (kernels_jax/common/layout.py): every sequence starts on a chunk boundary and is
zero-padded to whole chunks; tokens flattened to P = NT * C slots per head:
    q, k [H, P, K] (value head h reads q, k head h // G); qg, kg, w, g, dq, dk, dg [HV, P, K];
    v, u, v_new, do, dv, o [HV, P, V]; beta, db [HV, P, 1]; A, Aqk, Akk, dAqk, dAkk [HV, P, C]
    (row: a slot, column: a position in its chunk); h, dh [HV, NT, K, V]; h0, ht, dht, dh0
    [N, HV, K, V]; tables (seq, first, last, length) int32 [NT]: scalar prefetch.
g is FLA's log2 chunk-local gate cumsum; a padding slot holds its chunk's last real value (so
slot C - 1 is the chunk's total decay) and zero q, k, v, beta, do (it adds nothing).
Every kernel keeps whole K and V per block, computes in float32 and stores in its outputs'
dtypes; states are float32 VMEM scratch on an "arbitrary" chunk axis.

    intra      (HV, NT) parallel    w, u, kg, Aqk, Akk (FLA's chunk_kda_fwd_intra)
    fwd_h      (HV, NT) sequential  h, v_new, ht (chunk_gated_delta_rule_fwd_h)
    fwd_o      (HV, NT) parallel    o (chunk_gla_fwd_o_gk)
    bwd_dAv    (HV, NT) parallel    dAqk, dv (chunk_kda_bwd_dAv)
    bwd_dhu    (HV, NT) reversed    dh, dh0, dv (chunk_gated_delta_rule_bwd_dhu)
    bwd_wy     (HV, NT) parallel    dq, dk, dv, db, dg, dAkk (chunk_kda_bwd_wy_dqkg_fused)
    bwd_intra  (HV, NT) parallel    dq, dk, db, dg (chunk_kda_bwd_intra)
Decays exp2(g_i - g_j) (j <= i) are formed per channel with the exponent masked before the exp
(never an overflowing product), one column j at a time (`_pairs`), as FLA's diagonal blocks do.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common.config import KernelConfig
from kernels_jax.common.kernel_math import dot, params
from kernels_jax.common.platform import interpret_mode

from .chunk_math import F32, fori, iota, transpose, unit_lower_inverse

LN2 = math.log(2.0)


def _f32(ref):
    return ref[...].astype(F32)


def exp2(x):
    """2 ** x for x <= 0 (log2 gates): 2 ** n exactly (the float32 exponent field) times
    exp(f ln 2) for x = n + f, |f| <= 1/2, so that rounding x ln 2 costs at most 1/3 of an ulp
    where exp(x ln 2) loses |x ln 2| ulps (a chunk's gates reach -180 under stress); 0 below
    2 ** -126, as float32 without denormals."""
    n = jnp.clip(jnp.round(x), -127.0, 127.0)
    scale = lax.bitcast_convert_type((n.astype(jnp.int32) + 127) << 23, F32)  # 2 ** n; 0 at n = -127
    return scale * jnp.exp((x - n) * LN2)


def _row(x, j):
    """Row j (traced) of x [R, D] -> [1, D] (a masked sum: no dynamic slice)."""
    return jnp.sum(jnp.where(iota(x.shape, 0) == j, x, 0.0), axis=0, keepdims=True)


def _col(x, j):
    """Column j (traced) of x [R, D] -> [R, 1]."""
    return jnp.sum(jnp.where(iota(x.shape, 1) == j, x, 0.0), axis=1, keepdims=True)


def _lower(A, strict: bool = False):
    """A [C, C] with 0 above the diagonal (and on it when strict)."""
    r, c = iota(A.shape, 0), iota(A.shape, 1)
    return jnp.where(r > c if strict else r >= c, A, 0.0)


def _decay_from(g, j):
    """E [C, K] = exp2(g_i - g_j) for rows i >= j, else 0 (exponent masked before the exp)."""
    return exp2(jnp.where(iota((g.shape[0], 1), 0) >= j, g - _row(g, j), -jnp.inf))


def _pairs(xs, y, g):
    """P[i, j] = sum_c x_i[c] y_j[c] exp2(g_i[c] - g_j[c]) for j <= i, else 0, for each x in xs.
    xs: tuple of [C, K]; y, g [C, K] -> tuple of [C, C]."""
    C = g.shape[0]
    cols = iota((C, C), 1)

    def column(j, Ps):
        yd = _decay_from(g, j) * _row(y, j)  # [C, K]: y_j exp2(g_i - g_j), rows i >= j
        return tuple(jnp.where(cols == j, jnp.sum(x * yd, axis=1, keepdims=True), P) for x, P in zip(xs, Ps))

    return fori(0, C, column, tuple(jnp.zeros((C, C), F32) for _ in xs))


def _qk_spec(cfg: KernelConfig, index):
    """BlockSpec of a q or k chunk [C, K] for value head h: rows of q, k head h // G
    (KernelConfig.qk_head). index(c, *tables) -> the chunk."""
    return pl.BlockSpec((None, cfg.C, cfg.K), lambda h, c, *t: (cfg.qk_head(h), index(c, *t), 0))


def _call(kernel, name, cfg, in_specs, inputs, outs, tables, semantics=("parallel", "parallel"), scratch=()):
    """pallas_call over grid (HV, NT) with the 4 tables as scalar prefetch. outs: [(spec, shape,
    dtype)]."""
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),
        grid=(cfg.HV, cfg.NT),
        in_specs=in_specs,
        out_specs=[o[0] for o in outs],
        scratch_shapes=list(scratch),
    )
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct(o[1], o[2]) for o in outs],
        compiler_params=params(*semantics),
        interpret=interpret_mode(),
        name=name,
    )(*tables, *inputs)


def _specs(cfg: KernelConfig, index=lambda c, *t: c):
    """(rows(d): a chunk's [C, d] rows of an [HV, P, d] array, state: chunk c's [K, V] of
    [HV, NT, K, V], per_seq: the [K, V] of chunk c's sequence in [N, HV, K, V])."""
    C, K, V = cfg.C, cfg.K, cfg.V

    def rows(d):
        return pl.BlockSpec((None, C, d), lambda h, c, *t: (h, index(c, *t), 0))

    state = pl.BlockSpec((None, None, K, V), lambda h, c, *t: (h, index(c, *t), 0, 0))
    per_seq = pl.BlockSpec((None, None, K, V), lambda h, c, seq, *t: (seq[index(c, seq, *t)], h, 0, 0))
    return rows, state, per_seq


# ---------------------------------------------------------------- fwd_intra


def _intra_kernel(
    seq, first, last, length, q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, u_ref, kg_ref, Aqk_ref, Akk_ref, *, scale
):
    """One (value head, chunk): q, k, g, w, kg [C, K]; v, u [C, V]; beta [C, 1]; Aqk, Akk [C, C]."""
    q, k, v, g, beta = _f32(q_ref), _f32(k_ref), _f32(v_ref), g_ref[...], b_ref[...]
    Aqk, Kkk = _pairs((q, k), k, g)
    inv = unit_lower_inverse(_lower(Kkk, strict=True) * beta)
    eg = exp2(g)
    w_ref[...] = dot(inv, k * beta * eg).astype(w_ref.dtype)
    u_ref[...] = dot(inv, v * beta).astype(u_ref.dtype)
    kg_ref[...] = (k * exp2(g[-1:] - g)).astype(kg_ref.dtype)
    Aqk_ref[...] = (scale * Aqk).astype(Aqk_ref.dtype)
    Akk_ref[...] = inv.astype(Akk_ref.dtype)


def intra(q, k, v, g, beta, tables, cfg: KernelConfig, dtype):
    """q, k [H, P, K], v [HV, P, V], g [HV, P, K], beta [HV, P, 1] -> w [HV, P, K], u [HV, P, V],
    kg [HV, P, K], Aqk, Akk [HV, P, C], all in `dtype`."""
    HV, K, V, C, P = cfg.HV, cfg.K, cfg.V, cfg.C, cfg.slots
    rows, _, _ = _specs(cfg)
    same = lambda c, *t: c  # noqa: E731
    outs = [(rows(K), (HV, P, K), dtype), (rows(V), (HV, P, V), dtype), (rows(K), (HV, P, K), dtype)]
    outs += [(rows(C), (HV, P, C), dtype)] * 2
    in_specs = [_qk_spec(cfg, same), _qk_spec(cfg, same), rows(V), rows(K), rows(1)]
    kernel = functools.partial(_intra_kernel, scale=cfg.scale)
    return _call(kernel, "kda_chunk_fwd_intra", cfg, in_specs, (q, k, v, g, beta), outs, tables)


# ---------------------------------------------------------------- fwd_h


def _fwd_h_kernel(seq, first, last, length, kg_ref, w_ref, u_ref, g_ref, h0_ref, h_ref, vn_ref, ht_ref, S_ref):
    """One (value head, chunk), chunks in order: kg, w, g [C, K]; u, v_new [C, V]; h0, h, ht
    [K, V]; scratch S [K, V] (the state before the chunk)."""
    c = pl.program_id(1)

    @pl.when(first[c] == 1)
    def _():
        S_ref[...] = h0_ref[...]

    S = S_ref[...]
    h_ref[...] = S.astype(h_ref.dtype)
    vn = _f32(u_ref) - dot(_f32(w_ref), S)
    vn_ref[...] = vn.astype(vn_ref.dtype)
    decay = transpose(exp2(g_ref[...][-1:]))  # [K, 1]
    S = decay * S + dot(_f32(kg_ref), vn, trans_a=True)
    S_ref[...] = S

    @pl.when(last[c] == 1)
    def _():
        ht_ref[...] = S


def fwd_h(kg, w, u, g, h0, tables, cfg: KernelConfig, dtype):
    """kg, w, g [HV, P, K], u [HV, P, V], h0 [N, HV, K, V] float32 -> h [HV, NT, K, V] in
    `dtype`, v_new [HV, P, V] in u's dtype, ht [N, HV, K, V] float32."""
    HV, K, V, N, NT, P = cfg.HV, cfg.K, cfg.V, cfg.N, cfg.NT, cfg.slots
    rows, state, per_seq = _specs(cfg)
    outs = [(state, (HV, NT, K, V), dtype), (rows(V), (HV, P, V), u.dtype), (per_seq, (N, HV, K, V), F32)]
    in_specs = [rows(K), rows(K), rows(V), rows(K), per_seq]
    return _call(
        _fwd_h_kernel,
        "kda_chunk_fwd_h",
        cfg,
        in_specs,
        (kg, w, u, g, h0),
        outs,
        tables,
        semantics=("parallel", "arbitrary"),
        scratch=[pltpu.VMEM((K, V), F32)],
    )


# ---------------------------------------------------------------- fwd_o


def _fwd_o_kernel(seq, first, last, length, q_ref, v_ref, g_ref, A_ref, h_ref, o_ref, *, scale):
    """One (value head, chunk): q, g [C, K]; v_new, o [C, V]; A [C, C]; h [K, V]."""
    qg = _f32(q_ref) * exp2(g_ref[...])
    o = scale * dot(qg, _f32(h_ref)) + dot(_lower(_f32(A_ref)), _f32(v_ref))
    o_ref[...] = o.astype(o_ref.dtype)


def fwd_o(q, v, g, A, h, tables, cfg: KernelConfig):
    """q [H, P, K], v (v_new) [HV, P, V], g [HV, P, K], A (Aqk) [HV, P, C], h [HV, NT, K, V] ->
    o [HV, P, V] in v's dtype."""
    rows, state, _ = _specs(cfg)
    same = lambda c, *t: c  # noqa: E731
    in_specs = [_qk_spec(cfg, same), rows(cfg.V), rows(cfg.K), rows(cfg.C), state]
    outs = [(rows(cfg.V), (cfg.HV, cfg.slots, cfg.V), v.dtype)]
    kernel = functools.partial(_fwd_o_kernel, scale=cfg.scale)
    return _call(kernel, "kda_chunk_fwd_o", cfg, in_specs, (q, v, g, A, h), outs, tables)[0]


# ---------------------------------------------------------------- bwd_dAv


def _bwd_dAv_kernel(seq, first, last, length, v_ref, do_ref, A_ref, dA_ref, dv_ref, *, scale):
    """One (value head, chunk): v_new, do, dv [C, V]; A, dA [C, C]."""
    do = _f32(do_ref)
    dA_ref[...] = _lower(scale * dot(do, _f32(v_ref), trans_b=True))
    dv_ref[...] = dot(_lower(_f32(A_ref)), do, trans_a=True).astype(dv_ref.dtype)


def bwd_dAv(v, do, A, tables, cfg: KernelConfig, dv_dtype=None):
    """v (v_new), do [HV, P, V], A (Aqk) [HV, P, C] -> dAqk [HV, P, C] float32, dv [HV, P, V] in
    dv_dtype (default do's)."""
    HV, V, C, P = cfg.HV, cfg.V, cfg.C, cfg.slots
    rows, _, _ = _specs(cfg)
    outs = [(rows(C), (HV, P, C), F32), (rows(V), (HV, P, V), dv_dtype or do.dtype)]
    kernel = functools.partial(_bwd_dAv_kernel, scale=cfg.scale)
    return _call(kernel, "kda_chunk_bwd_dAv", cfg, [rows(V), rows(V), rows(C)], (v, do, A), outs, tables)


# ---------------------------------------------------------------- bwd_dhu


def _bwd_dhu_kernel(
    seq,
    first,
    last,
    length,
    qg_ref,
    kg_ref,
    w_ref,
    g_ref,
    dht_ref,
    do_ref,
    dv_ref,
    dh_ref,
    dh0_ref,
    dv2_ref,
    dS_ref,
    *,
    scale,
):
    """One (value head, chunk), chunks in reverse: qg, kg, w, g [C, K]; do, dv, dv2 [C, V]; dht,
    dh, dh0 [K, V]; scratch dS [K, V] (the gradient of the state after the chunk)."""
    c = pl.num_programs(1) - 1 - pl.program_id(1)

    @pl.when(last[c] == 1)
    def _():
        dS_ref[...] = dht_ref[...]

    dS = dS_ref[...]
    dh_ref[...] = dS.astype(dh_ref.dtype)
    dv2 = _f32(dv_ref) + dot(_f32(kg_ref), dS)
    dv2_ref[...] = dv2.astype(dv2_ref.dtype)
    decay = transpose(exp2(g_ref[...][-1:]))  # [K, 1]
    dS = decay * dS + scale * dot(_f32(qg_ref), _f32(do_ref), trans_a=True) - dot(_f32(w_ref), dv2, trans_a=True)
    dS_ref[...] = dS

    @pl.when(first[c] == 1)
    def _():
        dh0_ref[...] = dS


def bwd_dhu(qg, kg, w, g, dht, do, dv, tables, cfg: KernelConfig, dtype):
    """qg, kg, w, g [HV, P, K], dht [N, HV, K, V] float32, do, dv [HV, P, V] -> dh [HV, NT, K, V]
    in `dtype`, dh0 [N, HV, K, V] float32, dv [HV, P, V] in dv's dtype."""
    HV, K, V, N, NT, P = cfg.HV, cfg.K, cfg.V, cfg.N, cfg.NT, cfg.slots
    rows, state, per_seq = _specs(cfg, lambda c, *t: cfg.NT - 1 - c)
    outs = [(state, (HV, NT, K, V), dtype), (per_seq, (N, HV, K, V), F32), (rows(V), (HV, P, V), dv.dtype)]
    in_specs = [rows(K), rows(K), rows(K), rows(K), per_seq, rows(V), rows(V)]
    kernel = functools.partial(_bwd_dhu_kernel, scale=cfg.scale)
    return _call(
        kernel,
        "kda_chunk_bwd_dhu",
        cfg,
        in_specs,
        (qg, kg, w, g, dht, do, dv),
        outs,
        tables,
        semantics=("parallel", "arbitrary"),
        scratch=[pltpu.VMEM((K, V), F32)],
    )


# ---------------------------------------------------------------- bwd_wy


def _bwd_wy_kernel(
    seq,
    first,
    last,
    length,
    q_ref,
    k_ref,
    v_ref,
    vn_ref,
    g_ref,
    b_ref,
    A_ref,
    h_ref,
    do_ref,
    dh_ref,
    dv_ref,
    dq_ref,
    dk_ref,
    dv2_ref,
    db_ref,
    dg_ref,
    dA_ref,
    *,
    scale,
):
    """One (value head, chunk): q, k, g, dq, dk, dg [C, K]; v, v_new, do, dv, dv2 [C, V];
    beta, db [C, 1]; A (Akk), dA [C, C]; h, dh [K, V]."""
    c = pl.program_id(1)
    q, k, g, beta = _f32(q_ref), _f32(k_ref), g_ref[...], b_ref[...]
    v, dv, h, dh = _f32(v_ref), _f32(dv_ref), _f32(h_ref), _f32(dh_ref)
    A = _lower(_f32(A_ref))
    eg, g_last = exp2(g), g[-1:]
    dq = scale * eg * dot(_f32(do_ref), h, trans_b=True)
    dk_s = exp2(g_last - g) * dot(_f32(vn_ref), dh, trans_b=True)
    dw = -dot(dv, h, trans_b=True)
    kb = k * eg
    du = dot(A, dv, trans_a=True)  # Akk^T dv
    dx = dot(A, dw, trans_a=True)  # Akk^T dw
    dv2_ref[...] = (du * beta).astype(dv2_ref.dtype)
    db_ref[...] = jnp.sum(du * v, axis=1, keepdims=True) + jnp.sum(dx * kb, axis=1, keepdims=True)
    dq_ref[...] = dq
    dk_ref[...] = dk_s + dx * eg * beta
    # the chunk's total: exp2(g_last) sum_v h dh + sum_t k dk_s, on its last real token
    state_term = exp2(g_last) * transpose(jnp.sum(h * dh, axis=1, keepdims=True))  # [1, K]
    total = state_term + jnp.sum(k * dk_s, axis=0, keepdims=True)
    on_last = iota((g.shape[0], 1), 0) == length[c] - 1
    dg_ref[...] = q * dq - k * dk_s + kb * dx * beta + jnp.where(on_last, total, 0.0)
    P = _lower(dot(dv, v, trans_b=True) + dot(dw, kb, trans_b=True), strict=True) * transpose(beta)
    dA_ref[...] = -_lower(dot(A, dot(P, A, trans_b=True), trans_a=True), strict=True)


def bwd_wy(q, k, v, vn, g, beta, A, h, do, dh, dv, tables, cfg: KernelConfig):
    """q, k [H, P, K], v, v_new, do, dv [HV, P, V], g [HV, P, K], beta [HV, P, 1], A (Akk)
    [HV, P, C], h, dh [HV, NT, K, V] -> dq, dk [HV, P, K] float32, dv [HV, P, V] in v's dtype,
    db [HV, P, 1], dg [HV, P, K], dAkk [HV, P, C] float32."""
    HV, K, V, C, P = cfg.HV, cfg.K, cfg.V, cfg.C, cfg.slots
    rows, state, _ = _specs(cfg)
    same = lambda c, *t: c  # noqa: E731
    in_specs = [_qk_spec(cfg, same), _qk_spec(cfg, same), rows(V), rows(V), rows(K), rows(1), rows(C), state]
    in_specs += [rows(V), state, rows(V)]
    outs = [(rows(K), (HV, P, K), F32)] * 2 + [(rows(V), (HV, P, V), v.dtype), (rows(1), (HV, P, 1), F32)]
    outs += [(rows(K), (HV, P, K), F32), (rows(C), (HV, P, C), F32)]
    kernel = functools.partial(_bwd_wy_kernel, scale=cfg.scale)
    return _call(kernel, "kda_chunk_bwd_wy", cfg, in_specs, (q, k, v, vn, g, beta, A, h, do, dh, dv), outs, tables)


# ---------------------------------------------------------------- bwd_intra


def _bwd_intra_kernel(
    seq,
    first,
    last,
    length,
    q_ref,
    k_ref,
    g_ref,
    b_ref,
    dAqk_ref,
    dAkk_ref,
    dq_ref,
    dk_ref,
    db_ref,
    dg_ref,
    dq2_ref,
    dk2_ref,
    db2_ref,
    dg2_ref,
):
    """One (value head, chunk): q, k, g, dq, dk, dg (and their outputs) [C, K]; beta, db [C, 1];
    dAqk, dAkk [C, C] (lower triangles read)."""
    q, k, g, beta = _f32(q_ref), _f32(k_ref), g_ref[...], b_ref[...]
    dAq, dAk = _lower(dAqk_ref[...]), _lower(dAkk_ref[...])
    C = g.shape[0]
    rows = iota((C, 1), 0)
    kb = k * beta

    def column(j, acc):
        dq2, X, Y = acc
        E = _decay_from(g, j)  # [C, K], rows i >= j
        kj = _row(k, j) * E
        dq2 = dq2 + _col(dAq, j) * kj
        X = X + _col(dAk, j) * kj
        y = jnp.sum((_col(dAq, j) * q + _col(dAk, j) * kb) * E, axis=0, keepdims=True)  # [1, K]
        return dq2, X, jnp.where(rows == j, y, Y)

    zeros = jnp.zeros((C, k.shape[1]), F32)
    dq2, X, Y = fori(0, C, column, (zeros, zeros, zeros))
    dq2_ref[...] = dq_ref[...] + dq2
    db2_ref[...] = db_ref[...] + jnp.sum(X * k, axis=1, keepdims=True)
    dk2_ref[...] = dk_ref[...] + X * beta + Y
    dg2_ref[...] = dg_ref[...] + q * dq2 + (X * beta - Y) * k


def bwd_intra(q, k, g, beta, dAqk, dAkk, dq, dk, db, dg, tables, cfg: KernelConfig):
    """q, k [H, P, K], g [HV, P, K], beta, db [HV, P, 1], dAqk, dAkk [HV, P, C], dq, dk, dg
    [HV, P, K] float32 -> dq, dk [HV, P, K], db [HV, P, 1], dg [HV, P, K] float32."""
    HV, K, C, P = cfg.HV, cfg.K, cfg.C, cfg.slots
    rows, _, _ = _specs(cfg)
    same = lambda c, *t: c  # noqa: E731
    in_specs = [_qk_spec(cfg, same), _qk_spec(cfg, same), rows(K), rows(1), rows(C), rows(C)]
    in_specs += [rows(K), rows(K), rows(1), rows(K)]
    outs = [(rows(K), (HV, P, K), F32)] * 2 + [(rows(1), (HV, P, 1), F32), (rows(K), (HV, P, K), F32)]
    inputs = (q, k, g, beta, dAqk, dAkk, dq, dk, db, dg)
    return _call(_bwd_intra_kernel, "kda_chunk_bwd_intra", cfg, in_specs, inputs, outs, tables)
