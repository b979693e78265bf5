"""KDA's chunk stages under FLA 0.6.0's names and keyword calling convention (cases/stages/kda.py).

Each stage runs one Pallas kernel of kernels.py, the op's own (chunk.py calls the same functions):
a thin adapter that plans the layout on
the host (kernels_jax/common/config.prepare; cu_seqlens must be concrete), packs FLA's
[B, T, heads, D] tensors into the kernels' head-major chunk layout [heads, NT * C, D] (head dims
padded as chunk_kda pads them) and converts the results back, in FLA's dtypes. chunk_local_cumsum
is a compensated jnp scan (parity.model.kernels.XLA_STAGES).

Gates arrive as FLA's op passes them: gk / g [B, T, HV, K] the chunk-local cumsum of the op's
log-decays times 1 / ln 2 (the kernels take exp2 of differences of it, as FLA's do); a chunk's
padding slots repeat its last real value. States: FLA's h, dh [B, NT, HV, K, V] (NT chunks per
row, or over all packed sequences with B == 1; an empty sequence has none) <-> the kernels'
[HV, NT', K, V]. Every function is jax.jit-compatible for given static arguments (chunk_size,
scale, output_final_state, a concrete cu_seqlens).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels_jax.common import stage_layout
from kernels_jax.common.config import KernelConfig, prepare
from kernels_jax.common.layout import ChunkLayout
from kernels_jax.common.stage_layout import (
    gate_slots,
    gate_sources,
    require_concrete,
    seq_states,
    states_in,
    states_out,
)

from . import kernels
from .chunk import ALIGN
from .chunk_math import F32

# ---------------------------------------------------------------------------------------------
# host-side planning


class _Plan:
    """layout, cfg, tables (seq, first, last, length int32 [NT]), gate_src int32 [NT * C] (the
    slot each slot's gate is read from: a padding slot reads its chunk's last real one), keep
    int32 [NT_fla] (the kernels' chunks FLA counts: all but empty sequences' chunk)."""

    def __init__(self, stage, *, B, T, H, HV, K, V, dtype, g, scale=None, h0=None, cu_seqlens=None, chunk_size=64):
        require_concrete(cu_seqlens, "kda", stage)
        sds = jax.ShapeDtypeStruct
        q, v = sds((B, T, H, K), dtype), sds((B, T, HV, V), dtype)
        self.layout, self.cfg = prepare(
            "kda",
            q,
            q,
            v,
            align=ALIGN,
            g=g,
            beta=sds((B, T, HV), F32),
            scale=scale,
            initial_state=h0,
            cu_seqlens=cu_seqlens,
            chunk_size=chunk_size,
        )
        layout = self.layout
        self.gate_src, self.keep = gate_sources(layout)
        self.tables = tuple(jnp.asarray(t, jnp.int32) for t in (layout.seq, layout.first, layout.last, layout.length))


def _plan_for(stage, q, v, g, **kw) -> _Plan:
    """The plan of a stage whose q-like input is q [B, T, H, K] and v-like v [B, T, HV, V]."""
    B, T, H, K = q.shape
    return _Plan(stage, B=B, T=T, H=H, HV=v.shape[2], K=K, V=v.shape[3], dtype=q.dtype, g=g, **kw)


def _args(p: _Plan):
    """(layout, gate_src, keep, tables, cfg): the traced and static parts of a plan."""
    return p.layout, p.gate_src, p.keep, p.tables, p.cfg


# ---------------------------------------------------------------------------------------------
# conversions (traced)


def _beta(beta, layout: ChunkLayout):
    """beta / db [B, T, HV] -> [HV, P, 1] float32 (0 on padding)."""
    return layout.pack(beta.astype(F32)[..., None])


# ---------------------------------------------------------------------------------------------
# local_cumsum


def chunk_local_cumsum(g, chunk_size, scale=None, reverse=False, cu_seqlens=None, **unused):
    """g [B, T, HV, K] -> [B, T, HV, K] float32: the cumsum of g within each chunk (each sequence's
    chunks start at its first token; reversed: from each chunk's end), times scale when given.
    A compensated jnp scan on the packed layout (XLA_STAGES: not a Pallas kernel)."""
    return stage_layout.chunk_local_cumsum("kda", g, chunk_size, scale, reverse, cu_seqlens)


# ---------------------------------------------------------------------------------------------
# fwd_intra


def chunk_kda_fwd_intra(
    q, k, v, gk=None, beta=None, scale=None, cu_seqlens=None, chunk_size=64, disable_recompute=False, **unused
):
    """q, k [B, T, H, K], v [B, T, HV, V], gk [B, T, HV, K] (log2 cumsum), beta [B, T, HV] ->
    (w [B, T, HV, K], u [B, T, HV, V], None (qg: FLA stores it only with disable_recompute),
    kg [B, T, HV, K], Aqk, Akk [B, T, HV, C]) in k's dtype. safe_gate is accepted and changes
    nothing (the kernel forms each decay exactly). Kernel: kernels.intra."""
    if disable_recompute:
        raise ValueError("kda chunk_kda_fwd_intra: disable_recompute=True (qg) is not supported by this port")
    p = _plan_for("chunk_kda_fwd_intra", q, v, gk, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    w, u, kg, Aqk, Akk = _fwd_intra(q, k, v, gk, beta, *_args(p))
    return w, u, None, kg, Aqk, Akk


@functools.partial(jax.jit, static_argnums=(9,))
def _fwd_intra(q, k, v, gk, beta, layout, gate_src, keep, tables, cfg: KernelConfig):
    qp, kp, vp = layout.pack(q, cfg.K), layout.pack(k, cfg.K), layout.pack(v, cfg.V)
    gc, bp = gate_slots(gk, layout, gate_src, cfg.K), _beta(beta, layout)
    w, u, kg, Aqk, Akk = kernels.intra(qp, kp, vp, gc, bp, tables, cfg, k.dtype)
    K, V, C = cfg.K_in, cfg.V_in, cfg.C
    return tuple(layout.unpack(x, d) for x, d in ((w, K), (u, V), (kg, K), (Aqk, C), (Akk, C)))


# ---------------------------------------------------------------------------------------------
# fwd_h


def chunk_gated_delta_rule_fwd_h(
    k,
    w,
    u,
    g=None,
    gk=None,
    initial_state=None,
    output_final_state=False,
    chunk_size=64,
    state_v_first=False,
    cu_seqlens=None,
    **unused,
):
    """k (kg), w [B, T, HV, K], u [B, T, HV, V], gk [B, T, HV, K] (log2 cumsum), initial_state
    [N, HV, K, V] or None -> (h [B, NT, HV, K, V] in k's dtype: the state before each chunk,
    v_new [B, T, HV, V] in u's dtype, ht [N, HV, K, V] float32 or None unless
    output_final_state). Kernel: kernels.fwd_h."""
    _only_gk("chunk_gated_delta_rule_fwd_h", g, gk, state_v_first)
    p = _plan_for(
        "chunk_gated_delta_rule_fwd_h", k, u, gk, h0=initial_state, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    h, v_new, ht = _fwd_h(k, w, u, gk, initial_state, *_args(p))
    return h, v_new, (ht if output_final_state else None)


def _only_gk(stage, g, gk, state_v_first):
    if g is not None or gk is None:
        raise ValueError(f"kda {stage}: KDA passes the per-channel gate as gk (g must be None)")
    if state_v_first:
        raise ValueError(f"kda {stage}: state_v_first=True is not supported by this port")


@functools.partial(jax.jit, static_argnums=(9,))
def _fwd_h(kg, w, u, gk, h0, layout, gate_src, keep, tables, cfg: KernelConfig):
    h, v_new, ht = kernels.fwd_h(
        layout.pack(kg, cfg.K),
        layout.pack(w, cfg.K),
        layout.pack(u, cfg.V),
        gate_slots(gk, layout, gate_src, cfg.K),
        seq_states(h0, cfg),
        tables,
        cfg,
        kg.dtype,
    )
    return states_out(h, layout, keep, cfg).astype(kg.dtype), layout.unpack(v_new, cfg.V_in), cfg.cut_state(ht)


# ---------------------------------------------------------------------------------------------
# fwd_o


def chunk_gla_fwd_o_gk(q, v, g, A, h, scale, state_v_first=False, cu_seqlens=None, chunk_size=64, **unused):
    """q [B, T, H, K], v (v_new) [B, T, HV, V], g [B, T, HV, K] (log2 cumsum), A (Aqk)
    [B, T, HV, C], h [B, NT, HV, K, V] -> o [B, T, HV, V] in v's dtype. Kernel:
    kernels.fwd_o."""
    _only_gk("chunk_gla_fwd_o_gk", None, g, state_v_first)
    p = _plan_for("chunk_gla_fwd_o_gk", q, v, g, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    return _fwd_o(q, v, g, A, h, *_args(p))


@functools.partial(jax.jit, static_argnums=(9,))
def _fwd_o(q, v, g, A, h, layout, gate_src, keep, tables, cfg: KernelConfig):
    o = kernels.fwd_o(
        layout.pack(q, cfg.K),
        layout.pack(v, cfg.V),
        gate_slots(g, layout, gate_src, cfg.K),
        layout.pack(A),
        states_in(h, layout, keep, cfg),
        tables,
        cfg,
    )
    return layout.unpack(o, cfg.V_in)


# ---------------------------------------------------------------------------------------------
# bwd_dAv


def chunk_kda_bwd_dAv(q, k, v, do, A=None, scale=None, cu_seqlens=None, chunk_size=64, **unused):
    """q, k [B, T, H, K] (unused, as in FLA), v (v_new), do [B, T, HV, V], A (Aqk) [B, T, HV, C]
    -> (dAqk [B, T, HV, C] float32: scale do_i . v_j for j <= i, dv [B, T, HV, V] in do's dtype:
    tril(A)^T do). Kernel: kernels.bwd_dAv."""
    B, T, HV, C = A.shape
    zero_gate = np.broadcast_to(np.float32(0.0), (B, T, HV, k.shape[3]))  # no gate: only validated
    p = _plan_for("chunk_kda_bwd_dAv", q, v, zero_gate, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    return _bwd_dAv(v, do, A, *_args(p))


@functools.partial(jax.jit, static_argnums=(7,))
def _bwd_dAv(v, do, A, layout, gate_src, keep, tables, cfg: KernelConfig):
    dA, dv = kernels.bwd_dAv(layout.pack(v, cfg.V), layout.pack(do, cfg.V), layout.pack(A), tables, cfg)
    return layout.unpack(dA), layout.unpack(dv, cfg.V_in)


# ---------------------------------------------------------------------------------------------
# bwd_dhu


def chunk_gated_delta_rule_bwd_dhu(
    q,
    k,
    w,
    do,
    dv,
    g=None,
    gk=None,
    h0=None,
    dht=None,
    scale=None,
    state_v_first=False,
    cu_seqlens=None,
    chunk_size=64,
    **unused,
):
    """q (qg), k (kg), w [B, T, HV, K], do, dv [B, T, HV, V], gk [B, T, HV, K] (log2 cumsum), h0
    [N, HV, K, V] or None (only whether dh0 is wanted), dht [N, HV, K, V] or None (zeros) ->
    (dh [B, NT, HV, K, V] in q's dtype: the gradient w.r.t. the state after each chunk,
    dh0 [N, HV, K, V] float32 or None without h0, dv [B, T, HV, V] in dv's dtype: dv + kg dh).
    Kernel: kernels.bwd_dhu."""
    _only_gk("chunk_gated_delta_rule_bwd_dhu", g, gk, state_v_first)
    p = _plan_for(
        "chunk_gated_delta_rule_bwd_dhu", q, do, gk, scale=scale, h0=h0, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    dh, dh0, dv2 = _bwd_dhu(q, k, w, gk, dht, do, dv, *_args(p))
    return dh, (dh0 if h0 is not None else None), dv2


@functools.partial(jax.jit, static_argnums=(11,))
def _bwd_dhu(qg, kg, w, gk, dht, do, dv, layout, gate_src, keep, tables, cfg: KernelConfig):
    pk = lambda x: layout.pack(x, cfg.K)  # noqa: E731
    pv = lambda x: layout.pack(x, cfg.V)  # noqa: E731
    dh, dh0, dv2 = kernels.bwd_dhu(
        pk(qg),
        pk(kg),
        pk(w),
        gate_slots(gk, layout, gate_src, cfg.K),
        seq_states(dht, cfg),
        pv(do),
        pv(dv),
        tables,
        cfg,
        qg.dtype,
    )
    return states_out(dh, layout, keep, cfg).astype(qg.dtype), cfg.cut_state(dh0), layout.unpack(dv2, cfg.V_in)


# ---------------------------------------------------------------------------------------------
# bwd_wy


def chunk_kda_bwd_wy_dqkg_fused(
    q, k, v, v_new, g, beta, A, h, do, dh, dv, scale=None, state_v_first=False, cu_seqlens=None, chunk_size=64, **unused
):
    """q, k [B, T, H, K], v, v_new, do, dv [B, T, HV, V], g [B, T, HV, K] (log2 cumsum), beta
    [B, T, HV], A (Akk) [B, T, HV, C], h, dh [B, NT, HV, K, V] -> (dq, dk [B, T, HV, K] float32,
    dv [B, T, HV, V] in v's dtype, db [B, T, HV] float32, dg [B, T, HV, K] float32, dAkk
    [B, T, HV, C] float32). Kernel: kernels.bwd_wy."""
    _only_gk("chunk_kda_bwd_wy_dqkg_fused", None, g, state_v_first)
    p = _plan_for("chunk_kda_bwd_wy_dqkg_fused", q, v, g, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    return _bwd_wy(q, k, v, v_new, g, beta, A, h, do, dh, dv, *_args(p))


@functools.partial(jax.jit, static_argnums=(15,))
def _bwd_wy(q, k, v, vn, g, beta, A, h, do, dh, dv, layout, gate_src, keep, tables, cfg: KernelConfig):
    pk = lambda x: layout.pack(x, cfg.K)  # noqa: E731
    pv = lambda x: layout.pack(x, cfg.V)  # noqa: E731
    st = lambda x: states_in(x, layout, keep, cfg)  # noqa: E731
    dq, dk, dv2, db, dg, dA = kernels.bwd_wy(
        pk(q),
        pk(k),
        pv(v),
        pv(vn),
        gate_slots(g, layout, gate_src, cfg.K),
        _beta(beta, layout),
        layout.pack(A),
        st(h),
        pv(do),
        st(dh),
        pv(dv),
        tables,
        cfg,
    )
    K = cfg.K_in
    return (
        layout.unpack(dq, K),
        layout.unpack(dk, K),
        layout.unpack(dv2, cfg.V_in),
        layout.unpack(db)[..., 0],
        layout.unpack(dg, K),
        layout.unpack(dA),
    )


# ---------------------------------------------------------------------------------------------
# bwd_intra


def chunk_kda_bwd_intra(q, k, g, beta, dAqk, dAkk, dq, dk, db, dg, cu_seqlens=None, chunk_size=64, **unused):
    """q, k [B, T, H, K], g [B, T, HV, K] (log2 cumsum), beta, db [B, T, HV], dAqk, dAkk
    [B, T, HV, C] (lower triangles read), dq, dk, dg [B, T, HV, K] -> (dq, dk [B, T, HV, K],
    db [B, T, HV], dg [B, T, HV, K]) float32: the inputs plus the intra-chunk gradients through
    Aqk and Akk. safe_gate is accepted and changes nothing. Kernel: kernels.bwd_intra."""
    v_like = jax.ShapeDtypeStruct(g.shape, q.dtype)  # no values: only HV (V unused)
    p = _plan_for("chunk_kda_bwd_intra", q, v_like, g, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    return _bwd_intra(q, k, g, beta, dAqk, dAkk, dq, dk, db, dg, *_args(p))


@functools.partial(jax.jit, static_argnums=(14,))
def _bwd_intra(q, k, g, beta, dAqk, dAkk, dq, dk, db, dg, layout, gate_src, keep, tables, cfg: KernelConfig):
    dq2, dk2, db2, dg2 = kernels.bwd_intra(
        layout.pack(q, cfg.K),
        layout.pack(k, cfg.K),
        gate_slots(g, layout, gate_src, cfg.K),
        _beta(beta, layout),
        layout.pack(dAqk.astype(F32)),
        layout.pack(dAkk.astype(F32)),
        layout.pack(dq.astype(F32), cfg.K),
        layout.pack(dk.astype(F32), cfg.K),
        _beta(db, layout),
        layout.pack(dg.astype(F32), cfg.K),
        tables,
        cfg,
    )
    K = cfg.K_in
    return layout.unpack(dq2, K), layout.unpack(dk2, K), layout.unpack(db2)[..., 0], layout.unpack(dg2, K)
