"""Chunked Simple GLA: Pallas TPU kernels for forward and backward, behind jax.custom_vjp.

Recurrence (per sequence and head; S [K, V] float32):
    S_t = exp(g_t) S_{t-1} + k_t^T v_t,     o_t = scale * q_t S_t
With b the chunk-local cumulative sum of g (b_i <= 0, non-increasing), h_c the state
before chunk c and dh_c the gradient w.r.t. the state after chunk c:
    o_i    = scale * [sum_{j<=i} exp(b_i - b_j) (q_i.k_j) v_j + exp(b_i) q_i h_c]
    h_c+1  = exp(b_C) h_c + sum_j exp(b_C - b_j) k_j^T v_j
    dh_c-1 = exp(b_C) dh_c + scale * sum_i exp(b_i) q_i^T do_i
    db_i   = q_i.dq_i - k_i.dk_i  (+ <h_c+1, dh_c> on the chunk's last slot)
Every exponent is <= 0 (masked-exp-overflow, split-decay-overflow); states, decays and every
dot accumulate in float32. The kernels (stages, FLA's names):
    chunk_fwd_h      grid (H, K/bk, V/bv, NT)  sequential over chunks, state in VMEM scratch
    chunk_fwd_o      grid (H, V/bv, NT, K/bk)  K tiles accumulated in scratch
    chunk_bwd_dh     grid (H, K/bk, V/bv, NT)  reverse over chunks
    chunk_bwd_dv     grid (H, NT, V/bv, K/bk)
    chunk_bwd_dqk    grid (H, NT, K/bk, V/bv)  also db per K tile
Layouts (kernels_jax/common/layout.py): q, k [H, S, K]; v, do [H, S, V]; S = NT * C;
b [H, NT, C]; h, dh [H, NT, K, V]; h0, ht [N, H, K, V]; K, V padded to the tiles.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common.config import KernelConfig, prepare
from kernels_jax.common.kernel_math import (
    F32,
    advance_state,
    causal_decay,
    dot,
    params,
    row_sum,
    state_grad_step,
    total,
)
from kernels_jax.common.layout import ChunkLayout
from kernels_jax.common.platform import interpret_mode


def _decay_to_end(b_col, b_row):
    """(exp(b_C) [1, 1], exp(b_C - b_j) [C, 1]) for the chunk's last slot C."""
    b_last = b_row[:, -1:]
    return jnp.exp(b_last), jnp.exp(b_last - b_col)


# ---------------------------------------------------------------------------------------------
# forward


def _fwd_h_kernel(seq_ref, first_ref, last_ref, k_ref, v_ref, bcol_ref, brow_ref, *rest, has_h0):
    """One chunk of state passing: emit h_c (state before), update the state, emit ht at the end."""
    h0_ref, (h_ref, ht_ref, state) = (rest[0], rest[1:]) if has_h0 else (None, rest)
    c = pl.program_id(3)

    @pl.when(first_ref[c] == 1)
    def load_initial_state():
        state[...] = h0_ref[...].astype(F32) if has_h0 else jnp.zeros(state.shape, F32)

    h_ref[...] = state[...].astype(h_ref.dtype)
    decay_all, decay_to_end = _decay_to_end(bcol_ref[...], brow_ref[...])
    new = advance_state(state[...], k_ref[...], v_ref[...], decay_all, decay_to_end)
    state[...] = new

    @pl.when(last_ref[c] == 1)
    def emit_final_state():
        ht_ref[...] = new


def chunk_fwd_h(k, v, b, h0, tables, cfg: KernelConfig):
    """k [H, S, K], v [H, S, V], b [H, NT, C], h0 [N, H, K, V] or None, tables (seq, first, last) ->
    h [H, NT, K, V] (state before each chunk; float32) and ht [N, H, K, V] float32."""
    C, bk, bv = cfg.C, cfg.bk, cfg.bv
    chunk = lambda h, i, j, c, *t: (h, c, 0)
    in_specs = [
        pl.BlockSpec((None, C, bk), lambda h, i, j, c, *t: (h, c, i)),
        pl.BlockSpec((None, C, bv), lambda h, i, j, c, *t: (h, c, j)),
        pl.BlockSpec((None, C, 1), chunk),
        pl.BlockSpec((None, None, 1, C), lambda h, i, j, c, *t: (h, c, 0, 0)),
    ]
    state_spec = pl.BlockSpec((None, None, bk, bv), lambda h, i, j, c, seq, *t: (seq[c], h, i, j))
    args = [k, v, b.reshape(cfg.H, cfg.NT * C, 1), b.reshape(cfg.H, cfg.NT, 1, C)]
    if cfg.has_h0:
        in_specs.append(state_spec)
        args.append(h0)
    return pl.pallas_call(
        functools.partial(_fwd_h_kernel, has_h0=cfg.has_h0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            grid=(cfg.H, cfg.nk, cfg.nv, cfg.NT),
            in_specs=in_specs,
            out_specs=[pl.BlockSpec((None, None, bk, bv), lambda h, i, j, c, *t: (h, c, i, j)), state_spec],
            scratch_shapes=[pltpu.VMEM((bk, bv), F32)],
        ),
        out_shape=[
            jax.ShapeDtypeStruct((cfg.H, cfg.NT, cfg.K, cfg.V), F32),
            jax.ShapeDtypeStruct((cfg.N, cfg.H, cfg.K, cfg.V), F32),
        ],
        compiler_params=params("parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="simple_gla_chunk_fwd_h",
    )(*tables, *args)


def _fwd_o_kernel(q_ref, k_ref, v_ref, h_ref, bcol_ref, brow_ref, o_ref, acc_qk, acc_qh, *, scale, nk):
    """o for one chunk and V tile; q.k and q.h accumulate over K tiles (grid axis 3).
    q, k [C, bk]; v, o [C, bv]; h [bk, bv]; bcol [C, 1], brow [1, C]: the chunk's log-decays."""
    i = pl.program_id(3)
    q = q_ref[...]
    qk, qh = dot(q, k_ref[...], trans_b=True), dot(q, h_ref[...])

    @pl.when(i == 0)
    def start_sums():
        acc_qk[...], acc_qh[...] = qk, qh

    @pl.when(i > 0)
    def add_k_tile():
        acc_qk[...] += qk
        acc_qh[...] += qh

    @pl.when(i == nk - 1)
    def emit_output():
        b_col, b_row = bcol_ref[...], brow_ref[...]
        scores = acc_qk[...] * causal_decay(b_col, b_row) * scale
        o = dot(scores, v_ref[...]) + (scale * jnp.exp(b_col)) * acc_qh[...]
        o_ref[...] = o.astype(o_ref.dtype)


def chunk_fwd_o(q, k, v, h, b, cfg: KernelConfig):
    """q, k [H, S, K], v [H, S, V], h [H, NT, K, V], b [H, NT, C] -> o [H, S, V] in q's dtype."""
    C, bk, bv = cfg.C, cfg.bk, cfg.bv
    return pl.pallas_call(
        functools.partial(_fwd_o_kernel, scale=cfg.scale, nk=cfg.nk),
        grid=(cfg.H, cfg.nv, cfg.NT, cfg.nk),
        in_specs=[
            pl.BlockSpec((None, C, bk), lambda h, j, c, i: (h, c, i)),
            pl.BlockSpec((None, C, bk), lambda h, j, c, i: (h, c, i)),
            pl.BlockSpec((None, C, bv), lambda h, j, c, i: (h, c, j)),
            pl.BlockSpec((None, None, bk, bv), lambda h, j, c, i: (h, c, i, j)),
            pl.BlockSpec((None, C, 1), lambda h, j, c, i: (h, c, 0)),
            pl.BlockSpec((None, None, 1, C), lambda h, j, c, i: (h, c, 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, C, bv), lambda h, j, c, i: (h, c, j)),
        out_shape=jax.ShapeDtypeStruct(v.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((C, C), F32), pltpu.VMEM((C, bv), F32)],
        compiler_params=params("parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="simple_gla_chunk_fwd_o",
    )(q, k, v, h, b.reshape(cfg.H, cfg.NT * C, 1), b.reshape(cfg.H, cfg.NT, 1, C))


# ---------------------------------------------------------------------------------------------
# backward


def _bwd_dh_kernel(
    seq_ref, first_ref, last_ref, q_ref, do_ref, bcol_ref, brow_ref, dht_ref, dh_ref, *rest, scale, NT, has_h0
):
    """One chunk of the reverse state-gradient pass: emit dh_c (w.r.t. the state after chunk c).
    q [C, bk]; do [C, bv]; dht, dh, dh0 [bk, bv]; scratch dstate [bk, bv]."""
    dh0_ref, dstate = rest if has_h0 else (None, rest[0])
    c = NT - 1 - pl.program_id(3)

    @pl.when(last_ref[c] == 1)
    def load_final_state_grad():
        dstate[...] = dht_ref[...].astype(F32)

    dh_ref[...] = dstate[...]
    b_col = bcol_ref[...]
    decay_all, _ = _decay_to_end(b_col, brow_ref[...])
    new = state_grad_step(dstate[...], q_ref[...], do_ref[...], decay_all, jnp.exp(b_col), scale)
    dstate[...] = new

    if has_h0:

        @pl.when(first_ref[c] == 1)
        def emit_initial_state_grad():
            dh0_ref[...] = new


def chunk_bwd_dh(q, do, b, dht, tables, cfg: KernelConfig):
    """q [H, S, K], do [H, S, V], b [H, NT, C], dht [N, H, K, V] -> dh [H, NT, K, V] (gradient
    w.r.t. the state after each chunk) and dh0 [N, H, K, V] or None."""
    C, bk, bv, NT = cfg.C, cfg.bk, cfg.bv, cfg.NT
    rev = lambda c: NT - 1 - c
    state_spec = pl.BlockSpec((None, None, bk, bv), lambda h, i, j, c, seq, *t: (seq[rev(c)], h, i, j))
    in_specs = [
        pl.BlockSpec((None, C, bk), lambda h, i, j, c, *t: (h, rev(c), i)),
        pl.BlockSpec((None, C, bv), lambda h, i, j, c, *t: (h, rev(c), j)),
        pl.BlockSpec((None, C, 1), lambda h, i, j, c, *t: (h, rev(c), 0)),
        pl.BlockSpec((None, None, 1, C), lambda h, i, j, c, *t: (h, rev(c), 0, 0)),
        state_spec,
    ]
    out_specs = [pl.BlockSpec((None, None, bk, bv), lambda h, i, j, c, *t: (h, rev(c), i, j))]
    out_shape = [jax.ShapeDtypeStruct((cfg.H, NT, cfg.K, cfg.V), F32)]
    if cfg.has_h0:
        out_specs.append(state_spec)
        out_shape.append(jax.ShapeDtypeStruct((cfg.N, cfg.H, cfg.K, cfg.V), F32))
    out = pl.pallas_call(
        functools.partial(_bwd_dh_kernel, scale=cfg.scale, NT=NT, has_h0=cfg.has_h0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            grid=(cfg.H, cfg.nk, cfg.nv, NT),
            in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=[pltpu.VMEM((bk, bv), F32)],
        ),
        out_shape=out_shape,
        compiler_params=params("parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="simple_gla_chunk_bwd_dh",
    )(*tables, q, do, b.reshape(cfg.H, NT * C, 1), b.reshape(cfg.H, NT, 1, C), dht)
    return (out[0], out[1]) if cfg.has_h0 else (out[0], None)


def _bwd_dv_kernel(q_ref, k_ref, do_ref, dh_ref, bcol_ref, brow_ref, dv_ref, acc_kq, acc_dv, *, scale, nk):
    """dv_j = scale * sum_{i>=j} exp(b_i - b_j) (q_i.k_j) do_i + exp(b_C - b_j) k_j dh; K tiles on axis 3.
    q, k [C, bk]; do, dv [C, bv]; dh [bk, bv]; scratch acc_kq [C, C], acc_dv [C, bv]."""
    i = pl.program_id(3)
    b_col, b_row = bcol_ref[...], brow_ref[...]
    _, decay_to_end = _decay_to_end(b_col, b_row)
    kq = dot(k_ref[...], q_ref[...], trans_b=True)
    kdh = dot(k_ref[...] * decay_to_end, dh_ref[...])

    @pl.when(i == 0)
    def start_sums():
        acc_kq[...], acc_dv[...] = kq, kdh

    @pl.when(i > 0)
    def add_k_tile():
        acc_kq[...] += kq
        acc_dv[...] += kdh

    @pl.when(i == nk - 1)
    def emit_dv():
        scores_t = acc_kq[...] * causal_decay(b_col, b_row, transpose=True) * scale
        dv_ref[...] = (dot(scores_t, do_ref[...]) + acc_dv[...]).astype(dv_ref.dtype)


def chunk_bwd_dv(q, k, do, dh, b, cfg: KernelConfig, dtype):
    """q, k [H, S, K], do [H, S, V], dh [H, NT, K, V], b [H, NT, C] -> dv [H, S, V] in dtype."""
    C, bk, bv = cfg.C, cfg.bk, cfg.bv
    return pl.pallas_call(
        functools.partial(_bwd_dv_kernel, scale=cfg.scale, nk=cfg.nk),
        grid=(cfg.H, cfg.NT, cfg.nv, cfg.nk),
        in_specs=[
            pl.BlockSpec((None, C, bk), lambda h, c, j, i: (h, c, i)),
            pl.BlockSpec((None, C, bk), lambda h, c, j, i: (h, c, i)),
            pl.BlockSpec((None, C, bv), lambda h, c, j, i: (h, c, j)),
            pl.BlockSpec((None, None, bk, bv), lambda h, c, j, i: (h, c, i, j)),
            pl.BlockSpec((None, C, 1), lambda h, c, j, i: (h, c, 0)),
            pl.BlockSpec((None, None, 1, C), lambda h, c, j, i: (h, c, 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, C, bv), lambda h, c, j, i: (h, c, j)),
        out_shape=jax.ShapeDtypeStruct(do.shape, dtype),
        scratch_shapes=[pltpu.VMEM((C, C), F32), pltpu.VMEM((C, bv), F32)],
        compiler_params=params("parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="simple_gla_chunk_bwd_dv",
    )(q, k, do, dh, b.reshape(cfg.H, cfg.NT * C, 1), b.reshape(cfg.H, cfg.NT, 1, C))


def _bwd_dqk_kernel(
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    h_ref,
    dh_ref,
    bcol_ref,
    brow_ref,
    dq_ref,
    dk_ref,
    db_ref,
    acc_dov,
    acc_dq,
    acc_dk,
    acc_hdh,
    *,
    scale,
    nv,
):
    """dq, dk for one chunk and K tile, and that tile's share of db; V tiles accumulate on axis 3.
    q, k, dq, dk [C, bk]; v, do [C, bv]; h, dh [bk, bv]; db [C, 1]."""
    j = pl.program_id(3)
    do, v, h, dh = do_ref[...], v_ref[...], h_ref[...], dh_ref[...]
    parts = (dot(do, v, trans_b=True), dot(do, h, trans_b=True), dot(v, dh, trans_b=True), total(h * dh))
    accs = (acc_dov, acc_dq, acc_dk, acc_hdh)

    @pl.when(j == 0)
    def start_sums():
        for acc, part in zip(accs, parts):
            acc[...] = part

    @pl.when(j > 0)
    def add_v_tile():
        for acc, part in zip(accs, parts):
            acc[...] += part

    @pl.when(j == nv - 1)
    def emit_dq_dk_db():
        q, k = q_ref[...], k_ref[...]
        b_col, b_row = bcol_ref[...], brow_ref[...]
        decay_all, decay_to_end = _decay_to_end(b_col, b_row)
        dscores = acc_dov[...] * causal_decay(b_col, b_row) * scale
        dq = dot(dscores, k) + (scale * jnp.exp(b_col)) * acc_dq[...]
        dk_inter = decay_to_end * acc_dk[...]
        dk = dot(dscores, q, trans_a=True) + dk_inter
        q32, k32 = q.astype(F32), k.astype(F32)
        C = q.shape[0]
        at_end = jax.lax.broadcasted_iota(jnp.int32, (C, 1), 0) == C - 1
        end_term = decay_all * acc_hdh[...] + total(k32 * dk_inter)
        db_ref[...] = row_sum(q32 * dq - k32 * dk) + jnp.where(at_end, end_term, 0.0)
        dq_ref[...] = dq.astype(dq_ref.dtype)
        dk_ref[...] = dk.astype(dk_ref.dtype)


def chunk_bwd_dqk(q, k, v, do, h, dh, b, cfg: KernelConfig):
    """dq, dk [H, S, K] in q's dtype and db [H, NT, C] float32."""
    C, bk, bv = cfg.C, cfg.bk, cfg.bv
    S = cfg.NT * C
    dq, dk, db = pl.pallas_call(
        functools.partial(_bwd_dqk_kernel, scale=cfg.scale, nv=cfg.nv),
        grid=(cfg.H, cfg.NT, cfg.nk, cfg.nv),
        in_specs=[
            pl.BlockSpec((None, C, bk), lambda h, c, i, j: (h, c, i)),
            pl.BlockSpec((None, C, bk), lambda h, c, i, j: (h, c, i)),
            pl.BlockSpec((None, C, bv), lambda h, c, i, j: (h, c, j)),
            pl.BlockSpec((None, C, bv), lambda h, c, i, j: (h, c, j)),
            pl.BlockSpec((None, None, bk, bv), lambda h, c, i, j: (h, c, i, j)),
            pl.BlockSpec((None, None, bk, bv), lambda h, c, i, j: (h, c, i, j)),
            pl.BlockSpec((None, C, 1), lambda h, c, i, j: (h, c, 0)),
            pl.BlockSpec((None, None, 1, C), lambda h, c, i, j: (h, c, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, C, bk), lambda h, c, i, j: (h, c, i)),
            pl.BlockSpec((None, C, bk), lambda h, c, i, j: (h, c, i)),
            pl.BlockSpec((None, None, C, 1), lambda h, c, i, j: (h, i, c, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct((cfg.H, cfg.nk, S, 1), F32),
        ],
        scratch_shapes=[
            pltpu.VMEM((C, C), F32),
            pltpu.VMEM((C, bk), F32),
            pltpu.VMEM((C, bk), F32),
            pltpu.VMEM((1, 1), F32),
        ],
        compiler_params=params("parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="simple_gla_chunk_bwd_dqk",
    )(q, k, v, do, h, dh, b.reshape(cfg.H, S, 1), b.reshape(cfg.H, cfg.NT, 1, C))
    return dq, dk, db.sum(axis=1).reshape(cfg.H, cfg.NT, C)


# ---------------------------------------------------------------------------------------------
# custom_vjp over the chunked layout


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def chunk_core(q, k, v, b, h0, seq, first, last, cfg: KernelConfig):
    """(o [H, S, V], ht [N, H, K, V] float32) on the packed layout; b [H, NT, C]; seq, first,
    last int32 [NT] (the layout's tables)."""
    return _core_fwd(q, k, v, b, h0, seq, first, last, cfg)[0]


def _core_fwd(q, k, v, b, h0, seq, first, last, cfg):
    tables = (seq, first, last)
    h, ht = chunk_fwd_h(k, v, b, h0, tables, cfg)
    o = chunk_fwd_o(q, k, v, h, b, cfg)
    return (o, ht), (q, k, v, b, h, h0, tables)


def _core_bwd(cfg, res, cot):
    q, k, v, b, h, h0, tables = res
    do, dht = cot
    do = do.astype(q.dtype)
    dh, dh0 = chunk_bwd_dh(q, do, b, dht.astype(F32), tables, cfg)
    dv = chunk_bwd_dv(q, k, do, dh, b, cfg, v.dtype)
    dq, dk, db = chunk_bwd_dqk(q, k, v, do, h, dh, b, cfg)
    return dq, dk, dv, db, (None if h0 is None else dh0.astype(h0.dtype)), None, None, None


chunk_core.defvjp(_core_fwd, _core_bwd)


# ---------------------------------------------------------------------------------------------
# public entry point

ALIGN = 1  # head dims up to 128 are tiled as they are; past 128, padded to a multiple of 128


def chunk_log_decay(g, g_gamma, layout: ChunkLayout, H: int):
    """b [H, NT, C] float32: chunk-local cumulative log-decay (0 over padding slots' steps).
    g [B, T, H] or g_gamma [H] or neither."""
    NT, C = layout.NT, layout.C
    if g is not None:
        return jnp.cumsum(layout.pack(g.astype(F32)[..., None])[..., 0].reshape(H, NT, C), axis=-1)
    if g_gamma is not None:
        return g_gamma.astype(F32)[:, None, None] * layout.steps()[None]
    return jnp.zeros((H, NT, C), F32)


def chunk_simple_gla(
    q,
    k,
    v,
    g=None,
    g_gamma=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    chunk_size=64,
):
    """Simple GLA, chunked Pallas kernels (FLA's chunk_simple_gla convention).

    q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] or g_gamma [H] (log-decays <= 0, float32);
    initial_state [N, H, K, V]; cu_seqlens [N + 1] (B == 1). Returns o [B, T, H, V] in q's dtype
    and the final state [N, H, K, V] float32 (None unless output_final_state).
    Differentiable w.r.t. q, k, v, g or g_gamma and initial_state."""
    layout, cfg = prepare(
        "simple_gla",
        q,
        k,
        v,
        align=ALIGN,
        g=g,
        g_gamma=g_gamma,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    o, ht = _chunked(q, k, v, g, g_gamma, initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(7,))
def _chunked(q, k, v, g, g_gamma, initial_state, layout: ChunkLayout, cfg: KernelConfig):
    """The stages, compiled as one program: pack, gate cumsum, state passing and output
    (chunk_core), unpack."""
    b = chunk_log_decay(g, g_gamma, layout, cfg.H)
    qp, kp = layout.pack(q, cfg.K), layout.pack(k, cfg.K)
    vp = layout.pack(v, cfg.V)
    h0 = None if initial_state is None else cfg.pad_state(initial_state)
    o, ht = chunk_core(qp, kp, vp, b, h0, *layout.tables(), cfg)
    return layout.unpack(o, cfg.V_in), cfg.cut_state(ht)
