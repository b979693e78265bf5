"""GDN-2's four Pallas TPU kernels and their pallas_call builders.

Layout (built by chunk.py): every sequence starts on a chunk boundary and is zero-padded to
whole chunks; tokens are flattened to P = NT * C rows per head:
    q, k [H, P, K]; g, W [HV, P, K]; v, U, o, vn [HV, P, V]; A_qk [HV, P, C]
    gates: the erase gate b [HV, P, K] on the keys, the write gate w [HV, P, V] on the values
    states S [K, V] as in every op: h, dh [HV, NT, K, V]; h0, ht, dht, dh0 [N, HV, K, V]
Grids run over the HV value heads; value head h reads q, k head h // G (HV = G * H, FLA's
grouped value heads) through the index maps of q and k, never a repeated copy.
    tables (seq, first, last) int32 [NT] each (common/layout.py): scalar prefetch.
Padded rows have q = k = v = g = gates = 0, so they leave the state unchanged.

    intra            (HV, NT) parallel       W, U, A_qk per chunk (WY factors, triangular solve)
    recurrence_fwd   (HV, NV, NT) sequential o, v_new = U - W S, chunk-start states h, final states
    recurrence_bwd   (HV, NV, NT) reversed   dv_new, chunk-end state gradients dh, dh0
    chunk_grads      (HV, NT) parallel       dq, dk (per value head), dv, dg, db, dw from h, dh,
                                             v_new, dv_new
The two recurrences never read the gates; b enters A_kk through its keys
(A_kk[i, j] = sum_c b_i[c] k_i[c] k_j[c] exp(G_i[c] - G_j[c])).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common.config import KernelConfig
from kernels_jax.common.kernel_math import advance_state, dot, params, state_grad_step
from kernels_jax.common.platform import interpret_mode
from kernels_jax.kda.chunk_math import (
    F32,
    causal_mask,
    chunk_decays,
    decayed_products,
    decayed_products_grad,
    iota,
    reverse_cumsum,
    transpose,
    wy_factors,
)


def _f32(ref):
    return ref[...].astype(F32)


def _qk_rows(cfg: KernelConfig, chunk=None):
    """BlockSpec of a q or k chunk [C, K] for value head h: the rows of q, k head h // G. Grid
    (h, c); or, given chunk (grid c -> chunk), the recurrences' (h, iv, c, seq, first, last).
    (KernelConfig.qk_head)."""
    C, K = cfg.C, cfg.K
    if chunk is None:
        return pl.BlockSpec((None, C, K), lambda h, c: (cfg.qk_head(h), c, 0))
    return pl.BlockSpec((None, C, K), lambda h, iv, c, seq, first, last: (cfg.qk_head(h), chunk(c), 0))


# ---------------------------------------------------------------- intra-chunk (WY) kernel
def _intra_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, W_ref, U_ref, Aqk_ref):
    """One (head, chunk): q, k, g, b, W [C, K]; v, w, U [C, V]; A_qk [C, C]."""
    q, k, v, g = _f32(q_ref), _f32(k_ref), _f32(v_ref), g_ref[...]
    erase, write = b_ref[...], w_ref[...]
    decay, _, _ = chunk_decays(g)
    A_qk, A_kk = decayed_products((q, erase * k), k, g)
    A_kk = jnp.where(causal_mask(g.shape[0], strict=True), A_kk, 0.0)
    inv, X = wy_factors(A_kk, k, decay, erase)
    W_ref[...] = dot(inv, X)
    U_ref[...] = dot(inv, write * v)
    Aqk_ref[...] = A_qk


def intra(q, k, v, g, b, w, cfg: KernelConfig):
    """q, k [H, P, K], g, b [HV, P, K], v, w [HV, P, V] -> W [HV, P, K], U [HV, P, V], A_qk [HV, P, C]."""
    H, K, V, C, P = cfg.HV, cfg.K, cfg.V, cfg.C, cfg.slots
    rows = lambda d: pl.BlockSpec((None, C, d), lambda h, c: (h, c, 0))
    return pl.pallas_call(
        _intra_kernel,
        grid=(H, P // C),
        in_specs=[_qk_rows(cfg), _qk_rows(cfg), rows(V), rows(K), rows(K), rows(V)],
        out_specs=[rows(K), rows(V), rows(C)],
        out_shape=[
            jax.ShapeDtypeStruct((H, P, K), F32),
            jax.ShapeDtypeStruct((H, P, V), F32),
            jax.ShapeDtypeStruct((H, P, C), F32),
        ],
        compiler_params=params("parallel", "parallel"),
        interpret=interpret_mode(),
        name="gdn2_intra",
    )(q, k, v, g, b, w)


# ---------------------------------------------------------------- forward state recurrence
def _recurrence_fwd_kernel(
    seq_ref,
    first_ref,
    last_ref,
    q_ref,
    k_ref,
    g_ref,
    W_ref,
    U_ref,
    Aqk_ref,
    h0_ref,
    o_ref,
    vn_ref,
    *rest,
    scale: float,
    store_states: bool,
):
    h_ref, ht_ref, S_ref = rest if store_states else (None, *rest)
    """One (head, V tile, chunk): q, k, g, W [C, K]; U, o, v_new [C, BV]; A_qk [C, C];
    h0, h, ht [K, BV]; scratch S [K, BV]."""
    c = pl.program_id(2)

    @pl.when(first_ref[c] == 1)
    def load_initial_state():
        S_ref[...] = h0_ref[...]

    S = S_ref[...]  # [K, BV] state at the chunk start
    if store_states:
        h_ref[...] = S
    decay, decay_last, decay_to_end = chunk_decays(g_ref[...])
    vn = U_ref[...] - dot(W_ref[...], S)  # v_new = U - W S
    qg = _f32(q_ref) * decay
    o = scale * (dot(qg, S) + dot(Aqk_ref[...], vn))
    S = advance_state(S, _f32(k_ref), vn, transpose(decay_last), decay_to_end)
    o_ref[...] = o.astype(o_ref.dtype)
    vn_ref[...] = vn
    S_ref[...] = S

    @pl.when(last_ref[c] == 1)
    def emit_final_state():
        ht_ref[...] = S


def recurrence_fwd(q, k, g, W, U, A_qk, h0, tables, cfg: KernelConfig, *, out_dtype, store_states: bool):
    """-> o [HV, P, V] (out_dtype), v_new [HV, P, V], h [HV, NT, K, V] (if store_states), ht [N, HV, K, V]."""
    H, K, V, C, N, NT, BV, P = cfg.HV, cfg.K, cfg.V, cfg.C, cfg.N, cfg.NT, cfg.bv, cfg.slots
    same = lambda c: c  # noqa: E731 chunks in order
    rows = lambda d: pl.BlockSpec((None, C, d), lambda h, iv, c, seq, first, last: (h, c, 0))
    vrows = pl.BlockSpec((None, C, BV), lambda h, iv, c, seq, first, last: (h, c, iv))
    per_seq = pl.BlockSpec((None, None, K, BV), lambda h, iv, c, seq, first, last: (seq[c], h, 0, iv))
    out_specs = [vrows, vrows]
    out_shape = [jax.ShapeDtypeStruct((H, P, V), out_dtype), jax.ShapeDtypeStruct((H, P, V), F32)]
    if store_states:
        out_specs.append(pl.BlockSpec((None, None, K, BV), lambda h, iv, c, seq, first, last: (h, c, 0, iv)))
        out_shape.append(jax.ShapeDtypeStruct((H, NT, K, V), F32))
    out_specs.append(per_seq)
    out_shape.append(jax.ShapeDtypeStruct((N, H, K, V), F32))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(H, V // BV, NT),
        in_specs=[_qk_rows(cfg, same), _qk_rows(cfg, same), rows(K), rows(K), vrows, rows(C), per_seq],
        out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM((K, BV), F32)],
    )
    kernel = functools.partial(_recurrence_fwd_kernel, scale=cfg.scale, store_states=store_states)
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=out_shape,
        compiler_params=params("parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="gdn2_recurrence_fwd",
    )(*tables, q, k, g, W, U, A_qk, h0)


# ---------------------------------------------------------------- backward state recurrence
def _recurrence_bwd_kernel(
    seq_ref,
    first_ref,
    last_ref,
    q_ref,
    k_ref,
    g_ref,
    W_ref,
    Aqk_ref,
    do_ref,
    dht_ref,
    dvn_ref,
    dh_ref,
    dh0_ref,
    dS_ref,
    *,
    scale: float,
):
    """One (head, V tile, chunk), chunks in reverse: q, k, g, W [C, K]; do, dv_new [C, BV];
    A_qk [C, C]; dht, dh, dh0 [K, BV]; scratch dS [K, BV]."""
    c = pl.num_programs(2) - 1 - pl.program_id(2)

    @pl.when(last_ref[c] == 1)
    def load_final_state_grad():
        dS_ref[...] = dht_ref[...]

    dS = dS_ref[...]  # [K, BV] gradient of the chunk-end state
    dh_ref[...] = dS
    decay, decay_last, decay_to_end = chunk_decays(g_ref[...])
    do = _f32(do_ref)
    dvn = scale * dot(Aqk_ref[...], do, trans_a=True) + dot(_f32(k_ref) * decay_to_end, dS)
    dS = state_grad_step(dS, _f32(q_ref), do, transpose(decay_last), decay, scale) - dot(W_ref[...], dvn, trans_a=True)
    dvn_ref[...] = dvn
    dS_ref[...] = dS

    @pl.when(first_ref[c] == 1)
    def emit_initial_state_grad():
        dh0_ref[...] = dS


def recurrence_bwd(q, k, g, W, A_qk, do, dht, tables, cfg: KernelConfig):
    """-> dv_new [HV, P, V], dh [HV, NT, K, V] (gradient of each chunk-end state), dh0 [N, HV, K, V]."""
    H, K, V, C, N, NT, BV, P = cfg.HV, cfg.K, cfg.V, cfg.C, cfg.N, cfg.NT, cfg.bv, cfg.slots
    rev = lambda c: NT - 1 - c
    rows = lambda d: pl.BlockSpec((None, C, d), lambda h, iv, c, seq, first, last: (h, rev(c), 0))
    vrows = pl.BlockSpec((None, C, BV), lambda h, iv, c, seq, first, last: (h, rev(c), iv))
    per_seq = pl.BlockSpec((None, None, K, BV), lambda h, iv, c, seq, first, last: (seq[rev(c)], h, 0, iv))
    per_chunk = pl.BlockSpec((None, None, K, BV), lambda h, iv, c, seq, first, last: (h, rev(c), 0, iv))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(H, V // BV, NT),
        in_specs=[_qk_rows(cfg, rev), _qk_rows(cfg, rev), rows(K), rows(K), rows(C), vrows, per_seq],
        out_specs=[vrows, per_chunk, per_seq],
        scratch_shapes=[pltpu.VMEM((K, BV), F32)],
    )
    return pl.pallas_call(
        functools.partial(_recurrence_bwd_kernel, scale=cfg.scale),
        grid_spec=grid_spec,
        out_shape=[
            jax.ShapeDtypeStruct((H, P, V), F32),
            jax.ShapeDtypeStruct((H, NT, K, V), F32),
            jax.ShapeDtypeStruct((N, H, K, V), F32),
        ],
        compiler_params=params("parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="gdn2_recurrence_bwd",
    )(*tables, q, k, g, W, A_qk, do, dht)


# ---------------------------------------------------------------- per-chunk gradients
def _chunk_grads_kernel(
    q_ref,
    k_ref,
    v_ref,
    g_ref,
    b_ref,
    w_ref,
    h_ref,
    dh_ref,
    vn_ref,
    dvn_ref,
    do_ref,
    dq_ref,
    dk_ref,
    dv_ref,
    dg_ref,
    db_ref,
    dw_ref,
    *,
    scale: float,
):
    """One (head, chunk): q, k, g, b, dq, dk, dg, db [C, K]; v, w, v_new, dv_new, do, dv, dw [C, V];
    h, dh [K, V]."""
    q, k, v, g = _f32(q_ref), _f32(k_ref), _f32(v_ref), g_ref[...]
    erase, write = b_ref[...], w_ref[...]
    S, dS, vn, dvn, do = h_ref[...], dh_ref[...], vn_ref[...], dvn_ref[...], _f32(do_ref)  # S, dS [K, V]
    C = q.shape[0]
    decay, decay_last, decay_to_end = chunk_decays(g)
    strict = causal_mask(C, strict=True)
    bk = erase * k
    (A_kk,) = decayed_products((bk,), k, g)
    A_kk = jnp.where(strict, A_kk, 0.0)
    inv, X = wy_factors(A_kk, k, decay, erase)

    # o = scale (q exp(G)) S + scale A_qk v_new;  S_end = exp(G_last) S + (k exp(G_last - G))^T v_new
    dqg = scale * dot(do, S, trans_b=True)
    dA_qk = jnp.where(causal_mask(C, strict=False), scale * dot(do, vn, trans_b=True), 0.0)
    dkd = dot(vn, dS, trans_b=True)
    kd = k * decay_to_end
    state_dot = dot(jnp.ones((1, S.shape[1]), F32), S * dS, trans_b=True)  # [1, K]: sum_V S * dS
    dG_last = jnp.sum(dkd * kd, axis=0, keepdims=True) + decay_last * state_dot
    dq = dqg * decay
    dk = dkd * decay_to_end
    dG = dqg * q * decay - dkd * kd

    # v_new = U - W S, U = Inv (write v), W = Inv X, X = erase k exp(G)
    dW = -dot(dvn, S, trans_b=True)
    d_inv = dot(dvn, write * v, trans_b=True) + dot(dW, X, trans_b=True)
    d_bv = dot(inv, dvn, trans_a=True)
    dv = write * d_bv
    dX = dot(inv, dW, trans_a=True)
    dk = dk + erase * decay * dX
    dG = dG + X * dX
    # the write side's gradient (w: per V channel) and the erase side's (b: per K channel)
    d_write, d_erase = v * d_bv, k * decay * dX

    # Inv = (I + M)^-1:  dM = -Inv^T dInv Inv^T on the strict lower triangle
    dM = jnp.where(strict, -dot(dot(inv, d_inv, trans_a=True), inv, trans_b=True), 0.0)
    # M = A_kk built from the keys b * k
    (dxq, dxk), dyk = decayed_products_grad((dA_qk, dM), (q, bk), k, g)
    dq = dq + dxq
    dk = dk + erase * dxk + dyk
    dG = dG + q * dxq + bk * dxk - k * dyk
    dG = dG + jnp.where(iota((C, 1), 0) == C - 1, dG_last, 0.0)

    dq_ref[...] = dq
    dk_ref[...] = dk
    dv_ref[...] = dv
    dg_ref[...] = reverse_cumsum(dG)
    db_ref[...] = d_erase + k * dxk
    dw_ref[...] = d_write


def chunk_grads(q, k, v, g, b, w, h, dh, vn, dvn, do, cfg: KernelConfig):
    """-> dq, dk (each value head's share: chunk.py sums a group's), dv [HV, P, V], dg, db
    [HV, P, K], dw [HV, P, V]; all float32."""
    H, K, V, C, P = cfg.HV, cfg.K, cfg.V, cfg.C, cfg.slots
    rows = lambda d: pl.BlockSpec((None, C, d), lambda h_, c: (h_, c, 0))
    state = pl.BlockSpec((None, None, K, V), lambda h_, c: (h_, c, 0, 0))
    shape = lambda d: jax.ShapeDtypeStruct((H, P, d), F32)
    return pl.pallas_call(
        functools.partial(_chunk_grads_kernel, scale=cfg.scale),
        grid=(H, P // C),
        in_specs=[_qk_rows(cfg), _qk_rows(cfg), rows(V), rows(K), rows(K), rows(V)]
        + [state, state, rows(V), rows(V), rows(V)],
        out_specs=[rows(K), rows(K), rows(V), rows(K), rows(K), rows(V)],
        out_shape=[shape(K), shape(K), shape(V), shape(K), shape(K), shape(V)],
        compiler_params=params("parallel", "parallel"),
        interpret=interpret_mode(),
        name="gdn2_chunk_grads",
    )(q, k, v, g, b, w, h, dh, vn, dvn, do)
