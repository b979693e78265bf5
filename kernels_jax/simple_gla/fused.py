"""Fused Simple GLA for per-head g_gamma: one pallas_call forward, one backward.

The state S [K, V] lives in VMEM scratch across the sequential chunk axis; decays are
built in-kernel from g_gamma [H] (SMEM) and the chunk's real length, so with b_i =
gamma * min(i + 1, length) every exponent is <= 0.

Forward   grid (H, V/bv, NT): per chunk o = intra + exp(b_i) q S, then S <- update.
Backward  grid (H, 2, NT): phase 0 walks chunks forward, rebuilding S and emitting dq;
          phase 1 walks them backward with dS in scratch, emitting dk, dv and dh0.
          dq's block stays parked on its last chunk during phase 1 (and dk/dv on their
          first during phase 0), so no block is written back before it is computed.
dg_gamma: forward-mode in phase 0. With m_i = min(i + 1, length) (so b_i = gamma m_i), a
    tangent state G = dS/dgamma rides along with S (both [K, V] float32 scratch):
        G <- exp(b_C) (m_C S + G) + sum_j (m_C - m_j) exp(b_C - b_j) k_j^T v_j
    and dg_gamma = sum over chunks of
        sum_{i>=j} (m_i - m_j) scale exp(b_i - b_j) (q_i.k_j) (do_i.v_j)     (intra pairs)
      + scale sum_i exp(b_i) do_i . q_i (m_i S + G)                          (through the state)
    plus <dht, G> at each sequence's end. Every weight is >= 0 and <= chunk_size, so there
    is no large cancellation (the global form sum_t (t + 1)(q.dq - k.dk) loses ~T digits).
Layouts as in chunk.py: q, k [H, S, K]; v [H, S, V]; h0, ht [N, H, K, V]; g_gamma [H] and the
layout's tables (seq, first, last, length int32 [NT]) as scalar prefetch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common.config import KernelConfig, prepare
from kernels_jax.common.kernel_math import F32, advance_state, causal_decay, dot, params, state_grad_step, total
from kernels_jax.common.layout import ChunkLayout
from kernels_jax.common.platform import interpret_mode

from .chunk import ALIGN


def _chunk_steps(length_ref, c, C):
    """m_col [C, 1], m_row [1, C] float32: min(i + 1, length[c]), the decay steps up to slot i."""
    n = length_ref[c]
    col = jnp.minimum(lax.broadcasted_iota(jnp.int32, (C, 1), 0) + 1, n).astype(F32)
    row = jnp.minimum(lax.broadcasted_iota(jnp.int32, (1, C), 1) + 1, n).astype(F32)
    return col, row


def _chunk_decay(gamma_ref, length_ref, c, C):
    """The current head's decays with every exponent gamma * (whole steps), rounded once:
    (intra [C, C] exp(b_i - b_j) masked to i >= j; read [C, 1] exp(b_i); to_end [C, 1]
    exp(b_C - b_j); chunk [1, 1] exp(b_C)), b_i = gamma * min(i + 1, length[c])."""
    gamma = gamma_ref[pl.program_id(0)]
    m_col, m_row = _chunk_steps(length_ref, c, C)
    m_last = m_row[:, -1:]
    return (
        causal_decay(m_col, m_row, gamma=gamma),
        jnp.exp(gamma * m_col),
        jnp.exp(gamma * (m_last - m_col)),
        jnp.exp(gamma * m_last),
    )


def _fwd_kernel(seq_ref, first_ref, last_ref, length_ref, gamma_ref, q_ref, k_ref, v_ref, *rest, scale, has_h0):
    """One (head, V tile, chunk): q, k [C, K]; v, o [C, bv]; h0, ht [K, bv]; scratch state [K, bv]."""
    h0_ref, (o_ref, ht_ref, state) = (rest[0], rest[1:]) if has_h0 else (None, rest)
    c = pl.program_id(2)
    C = q_ref.shape[0]

    @pl.when(first_ref[c] == 1)
    def load_initial_state():
        state[...] = h0_ref[...].astype(F32) if has_h0 else jnp.zeros(state.shape, F32)

    intra, read, to_end, whole = _chunk_decay(gamma_ref, length_ref, c, C)
    q, k, v = q_ref[...], k_ref[...], v_ref[...]
    s = state[...]
    scores = dot(q, k, trans_b=True) * intra * scale
    o_ref[...] = (dot(scores, v) + (scale * read) * dot(q, s)).astype(o_ref.dtype)
    new = advance_state(s, k, v, whole, to_end)
    state[...] = new

    @pl.when(last_ref[c] == 1)
    def emit_final_state():
        ht_ref[...] = new


def fused_fwd(q, k, v, g_gamma, h0, tables, cfg: KernelConfig):
    """q, k [H, S, K], v [H, S, V], g_gamma [H], h0 [N, H, K, V] or None, tables (seq, first, last,
    length) -> o [H, S, V] in q's dtype, ht [N, H, K, V] float32."""
    C, K, bv = cfg.C, cfg.K, cfg.bv
    state_spec = pl.BlockSpec((None, None, K, bv), lambda h, j, c, seq, *t: (seq[c], h, 0, j))
    in_specs = [
        pl.BlockSpec((None, C, K), lambda h, j, c, *t: (h, c, 0)),
        pl.BlockSpec((None, C, K), lambda h, j, c, *t: (h, c, 0)),
        pl.BlockSpec((None, C, bv), lambda h, j, c, *t: (h, c, j)),
    ]
    args = [q, k, v]
    if cfg.has_h0:
        in_specs.append(state_spec)
        args.append(h0)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, scale=cfg.scale, has_h0=cfg.has_h0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5,
            grid=(cfg.H, cfg.V // bv, cfg.NT),
            in_specs=in_specs,
            out_specs=[pl.BlockSpec((None, C, bv), lambda h, j, c, *t: (h, c, j)), state_spec],
            scratch_shapes=[pltpu.VMEM((K, bv), F32)],
        ),
        out_shape=[jax.ShapeDtypeStruct(v.shape, q.dtype), jax.ShapeDtypeStruct((cfg.N, cfg.H, K, cfg.V), F32)],
        compiler_params=params("parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="simple_gla_fused_fwd",
    )(*tables, g_gamma.astype(F32), *args)


def _bwd_kernel(
    seq_ref, first_ref, last_ref, length_ref, gamma_ref, q_ref, k_ref, v_ref, do_ref, dht_ref, *rest, scale, NT, has_h0
):
    """One (head, phase, step): q, k, dq, dk [C, K]; v, do, dv [C, V]; h0, dht, dh0 [K, V];
    scratch state, tangent, dstate [K, V], acc [1, 1] (dg_gamma)."""
    if has_h0:
        h0_ref, dq_ref, dk_ref, dv_ref, dh0_ref, dgamma_ref, state, tangent, dstate, acc = rest
    else:
        h0_ref = dh0_ref = None
        dq_ref, dk_ref, dv_ref, dgamma_ref, state, tangent, dstate, acc = rest
    phase, t = pl.program_id(1), pl.program_id(2)
    c = jnp.where(phase == 0, t, NT - 1 - t)
    C = q_ref.shape[0]
    intra, read, to_end, whole = _chunk_decay(gamma_ref, length_ref, c, C)
    m_col, m_row = _chunk_steps(length_ref, c, C)
    m_last = m_row[:, -1:]
    read = scale * read
    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]

    @pl.when((phase == 0) & (t == 0))
    def start_dgamma():
        acc[...] = jnp.zeros(acc.shape, F32)

    @pl.when(phase == 0)
    def forward_over_chunks():
        @pl.when(first_ref[c] == 1)
        def load_initial_state():
            state[...] = h0_ref[...].astype(F32) if has_h0 else jnp.zeros(state.shape, F32)
            tangent[...] = jnp.zeros(tangent.shape, F32)

        s, ts = state[...], tangent[...]
        dscores = dot(do, v, trans_b=True) * intra * scale
        do_s = dot(do, s, trans_b=True)  # [C, K]: do_i S^T
        dq = dot(dscores, k) + read * do_s
        dq_ref[...] = dq.astype(dq_ref.dtype)
        pairs = total(dscores * dot(q, k, trans_b=True) * (m_col - m_row))
        through_state = total(read * q.astype(F32) * (m_col * do_s + dot(do, ts, trans_b=True)))
        acc[...] += pairs + through_state
        state[...] = advance_state(s, k, v, whole, to_end)
        tangent[...] = whole * (m_last * s + ts) + dot(k * (to_end * (m_last - m_col)), v, trans_a=True)

        @pl.when(last_ref[c] == 1)
        def add_final_state_term():
            acc[...] += total(dht_ref[...] * tangent[...])

    @pl.when(phase == 1)
    def backward_over_chunks():
        @pl.when(last_ref[c] == 1)
        def load_final_state_grad():
            dstate[...] = dht_ref[...].astype(F32)

        ds = dstate[...]
        decay_t = causal_decay(m_col, m_row, transpose=True, gamma=gamma_ref[pl.program_id(0)]) * scale
        dscores_t = dot(v, do, trans_b=True) * decay_t  # [j, i]
        scores_t = dot(k, q, trans_b=True) * decay_t  # [j, i]
        dk = dot(dscores_t, q) + to_end * dot(v, ds, trans_b=True)
        dv = dot(scores_t, do) + to_end * dot(k, ds)
        dk_ref[...] = dk.astype(dk_ref.dtype)
        dv_ref[...] = dv.astype(dv_ref.dtype)
        new = state_grad_step(ds, q, do, whole, read, 1.0)
        dstate[...] = new

        if has_h0:

            @pl.when(first_ref[c] == 1)
            def emit_initial_state_grad():
                dh0_ref[...] = new

        @pl.when(t == NT - 1)
        def emit_dgamma():
            dgamma_ref[...] = acc[...]


def fused_bwd(q, k, v, do, g_gamma, h0, dht, tables, cfg: KernelConfig):
    """-> dq, dk [H, S, K]; dv [H, S, V] (input dtypes); dh0 [N, H, K, V] or None; dg_gamma [H]."""
    C, K, V, NT = cfg.C, cfg.K, cfg.V, cfg.NT
    at_chunk = lambda h, p, t, *s: (h, t + p * (NT - 1 - 2 * t), 0)  # phase 0: t; phase 1: NT-1-t
    dq_at = lambda h, p, t, *s: (h, t + p * (NT - 1 - t), 0)  # parked on NT-1 in phase 1
    dkv_at = lambda h, p, t, *s: (h, NT - 1 - t * p, 0)  # parked on NT-1 in phase 0
    state_at = lambda h, p, t, seq, *s: (seq[t + p * (NT - 1 - 2 * t)], h, 0, 0)
    dh0_at = lambda h, p, t, seq, *s: (seq[NT - 1 - t * p], h, 0, 0)
    in_specs = [
        pl.BlockSpec((None, C, K), at_chunk),
        pl.BlockSpec((None, C, K), at_chunk),
        pl.BlockSpec((None, C, V), at_chunk),
        pl.BlockSpec((None, C, V), at_chunk),
        pl.BlockSpec((None, None, K, V), state_at),
    ]
    args = [q, k, v, do, dht]
    out_specs = [
        pl.BlockSpec((None, C, K), dq_at),
        pl.BlockSpec((None, C, K), dkv_at),
        pl.BlockSpec((None, C, V), dkv_at),
    ]
    out_shape = [
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
    ]
    if cfg.has_h0:
        in_specs.append(pl.BlockSpec((None, None, K, V), state_at))
        args.append(h0)
        out_specs.append(pl.BlockSpec((None, None, K, V), dh0_at))
        out_shape.append(jax.ShapeDtypeStruct((cfg.N, cfg.H, K, V), F32))
    out_specs.append(pl.BlockSpec((None, 1, 1), lambda h, p, t, *s: (h, 0, 0)))
    out_shape.append(jax.ShapeDtypeStruct((cfg.H, 1, 1), F32))
    out = pl.pallas_call(
        functools.partial(_bwd_kernel, scale=cfg.scale, NT=NT, has_h0=cfg.has_h0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5,
            grid=(cfg.H, 2, NT),
            in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=[pltpu.VMEM((K, V), F32)] * 3 + [pltpu.VMEM((1, 1), F32)],
        ),
        out_shape=out_shape,
        compiler_params=params("parallel", "arbitrary", "arbitrary"),
        interpret=interpret_mode(),
        name="simple_gla_fused_bwd",
    )(*tables, g_gamma.astype(F32), *args)
    dq, dk, dv = out[:3]
    dh0 = out[3] if cfg.has_h0 else None
    return dq, dk, dv, dh0, out[-1].sum(axis=(1, 2))


@functools.partial(jax.custom_vjp, nondiff_argnums=(9,))
def fused_core(q, k, v, g_gamma, h0, seq, first, last, length, cfg: KernelConfig):
    """(o [H, S, V], ht [N, H, K, V] float32) on the packed layout; seq, first, last, length
    int32 [NT] (the layout's tables)."""
    return fused_fwd(q, k, v, g_gamma, h0, (seq, first, last, length), cfg)


def _fused_core_fwd(q, k, v, g_gamma, h0, seq, first, last, length, cfg):
    tables = (seq, first, last, length)
    return fused_fwd(q, k, v, g_gamma, h0, tables, cfg), (q, k, v, g_gamma, h0, tables)


def _fused_core_bwd(cfg, res, cot):
    q, k, v, g_gamma, h0, tables = res
    do, dht = cot
    dq, dk, dv, dh0, dg_gamma = fused_bwd(q, k, v, do.astype(q.dtype), g_gamma, h0, dht.astype(F32), tables, cfg)
    return (
        dq,
        dk,
        dv,
        dg_gamma.astype(g_gamma.dtype),
        (None if h0 is None else dh0.astype(h0.dtype)),
        None,
        None,
        None,
        None,
    )


fused_core.defvjp(_fused_core_fwd, _fused_core_bwd)


def fused_chunk_simple_gla(
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
    """Simple GLA with per-head g_gamma [H], fused Pallas kernels (FLA's calling convention).

    q, k [B, T, H, K]; v [B, T, H, V]; g_gamma [H] float32 <= 0 (g must be None);
    initial_state [N, H, K, V]; cu_seqlens [N + 1] (B == 1). Returns o [B, T, H, V] in q's
    dtype and the final state [N, H, K, V] float32 (None unless output_final_state).
    Differentiable w.r.t. q, k, v, g_gamma and initial_state."""
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
        require_g_gamma=True,
    )
    o, ht = _fused(q, k, v, g_gamma, initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(6,))
def _fused(q, k, v, g_gamma, initial_state, layout: ChunkLayout, cfg: KernelConfig):
    qp, kp, vp = layout.pack(q, cfg.K), layout.pack(k, cfg.K), layout.pack(v, cfg.V)
    h0 = None if initial_state is None else cfg.pad_state(initial_state)
    length = jnp.asarray(layout.length, jnp.int32)
    o, ht = fused_core(qp, kp, vp, g_gamma, h0, *layout.tables(), length, cfg)
    return layout.unpack(o, cfg.V_in), cfg.cut_state(ht)
