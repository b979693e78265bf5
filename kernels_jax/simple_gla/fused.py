"""Fused Simple GLA for per-head g_gamma: one pallas_call forward, one backward.

The state S [K, V] lives in VMEM scratch across the sequential chunk axis; decays are
built in-kernel from g_gamma [H] (SMEM) and the chunk's real length, so with b_i =
gamma * min(i + 1, length) every exponent is <= 0.

Forward   grid (R, H, V/bv, NT): per chunk o = intra + exp(b_i) q S, then S <- update.
Backward  grid (R, H, 2, NT): phase 0 walks chunks forward, rebuilding S and emitting dq;
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
Layouts as in chunk.py: q, k [R, H, S, K]; v [R, H, S, V]; h0, ht [N, H, K, V].
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common import chunking
from kernels_jax.common.kernel_math import F32, causal_decay, dot, params, total
from kernels_jax.common.platform import interpret_mode

from .chunk import prepare


@dataclasses.dataclass(frozen=True)
class FusedConfig:
    R: int
    H: int
    K: int
    V: int
    C: int
    NT: int
    N: int
    scale: float
    tables: tuple[tuple[int, ...], ...]   # seq, first, last, length
    has_h0: bool

    @property
    def bv(self) -> int:
        return 128 if self.V % 128 == 0 else self.V

    def prefetch(self, g_gamma):
        return [jnp.asarray(t, jnp.int32) for t in self.tables] + [g_gamma.astype(F32)]


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
    gamma = gamma_ref[pl.program_id(1)]
    m_col, m_row = _chunk_steps(length_ref, c, C)
    m_last = m_row[:, -1:]
    return (causal_decay(m_col, m_row, gamma=gamma), jnp.exp(gamma * m_col), jnp.exp(gamma * (m_last - m_col)),
            jnp.exp(gamma * m_last))


def _fwd_kernel(seq_ref, first_ref, last_ref, length_ref, gamma_ref, q_ref, k_ref, v_ref, *rest,
                scale, has_h0):
    h0_ref, (o_ref, ht_ref, state) = (rest[0], rest[1:]) if has_h0 else (None, rest)
    c = pl.program_id(3)
    C = q_ref.shape[0]

    @pl.when(first_ref[c] == 1)
    def _():
        state[...] = h0_ref[...].astype(F32) if has_h0 else jnp.zeros(state.shape, F32)

    intra, read, to_end, whole = _chunk_decay(gamma_ref, length_ref, c, C)
    q, k, v = q_ref[...], k_ref[...], v_ref[...]
    s = state[...]
    scores = dot(q, k, trans_b=True) * intra * scale
    o_ref[...] = (dot(scores, v) + (scale * read) * dot(q, s)).astype(o_ref.dtype)
    new = whole * s + dot(k * to_end, v, trans_a=True)
    state[...] = new

    @pl.when(last_ref[c] == 1)
    def _():
        ht_ref[...] = new


def fused_fwd(q, k, v, g_gamma, h0, cfg: FusedConfig):
    """o [R, H, S, V] in q's dtype, ht [N, H, K, V] float32."""
    C, K, bv = cfg.C, cfg.K, cfg.bv
    state_spec = pl.BlockSpec((None, None, K, bv), lambda r, h, j, c, seq, *t: (r + seq[c], h, 0, j))
    in_specs = [pl.BlockSpec((None, None, C, K), lambda r, h, j, c, *t: (r, h, c, 0)),
                pl.BlockSpec((None, None, C, K), lambda r, h, j, c, *t: (r, h, c, 0)),
                pl.BlockSpec((None, None, C, bv), lambda r, h, j, c, *t: (r, h, c, j))]
    args = [q, k, v]
    if cfg.has_h0:
        in_specs.append(state_spec)
        args.append(h0)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, scale=cfg.scale, has_h0=cfg.has_h0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5, grid=(cfg.R, cfg.H, cfg.V // bv, cfg.NT), in_specs=in_specs,
            out_specs=[pl.BlockSpec((None, None, C, bv), lambda r, h, j, c, *t: (r, h, c, j)), state_spec],
            scratch_shapes=[pltpu.VMEM((K, bv), F32)]),
        out_shape=[jax.ShapeDtypeStruct(v.shape, q.dtype),
                   jax.ShapeDtypeStruct((cfg.N, cfg.H, K, cfg.V), F32)],
        compiler_params=params("parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(), name="simple_gla_fused_fwd",
    )(*cfg.prefetch(g_gamma), *args)


def _bwd_kernel(seq_ref, first_ref, last_ref, length_ref, gamma_ref,
                q_ref, k_ref, v_ref, do_ref, dht_ref, *rest, scale, NT, has_h0):
    if has_h0:
        h0_ref, dq_ref, dk_ref, dv_ref, dh0_ref, dgamma_ref, state, tangent, dstate, acc = rest
    else:
        h0_ref = dh0_ref = None
        dq_ref, dk_ref, dv_ref, dgamma_ref, state, tangent, dstate, acc = rest
    phase, t = pl.program_id(2), pl.program_id(3)
    c = jnp.where(phase == 0, t, NT - 1 - t)
    C = q_ref.shape[0]
    intra, read, to_end, whole = _chunk_decay(gamma_ref, length_ref, c, C)
    m_col, m_row = _chunk_steps(length_ref, c, C)
    m_last = m_row[:, -1:]
    read = scale * read
    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]

    @pl.when((phase == 0) & (t == 0))
    def _():
        acc[...] = jnp.zeros(acc.shape, F32)

    @pl.when(phase == 0)
    def _():
        @pl.when(first_ref[c] == 1)
        def _():
            state[...] = h0_ref[...].astype(F32) if has_h0 else jnp.zeros(state.shape, F32)
            tangent[...] = jnp.zeros(tangent.shape, F32)

        s, ts = state[...], tangent[...]
        dscores = dot(do, v, trans_b=True) * intra * scale
        do_s = dot(do, s, trans_b=True)                          # [C, K]: do_i S^T
        dq = dot(dscores, k) + read * do_s
        dq_ref[...] = dq.astype(dq_ref.dtype)
        pairs = total(dscores * dot(q, k, trans_b=True) * (m_col - m_row))
        through_state = total(read * q.astype(F32) * (m_col * do_s + dot(do, ts, trans_b=True)))
        acc[...] += pairs + through_state
        state[...] = whole * s + dot(k * to_end, v, trans_a=True)
        tangent[...] = whole * (m_last * s + ts) + dot(k * (to_end * (m_last - m_col)), v, trans_a=True)

        @pl.when(last_ref[c] == 1)
        def _():
            acc[...] += total(dht_ref[...] * tangent[...])

    @pl.when(phase == 1)
    def _():
        @pl.when(last_ref[c] == 1)
        def _():
            dstate[...] = dht_ref[...].astype(F32)

        ds = dstate[...]
        decay_t = causal_decay(m_col, m_row, transpose=True, gamma=gamma_ref[pl.program_id(1)]) * scale
        dscores_t = dot(v, do, trans_b=True) * decay_t          # [j, i]
        scores_t = dot(k, q, trans_b=True) * decay_t            # [j, i]
        dk = dot(dscores_t, q) + to_end * dot(v, ds, trans_b=True)
        dv = dot(scores_t, do) + to_end * dot(k, ds)
        dk_ref[...] = dk.astype(dk_ref.dtype)
        dv_ref[...] = dv.astype(dv_ref.dtype)
        new = whole * ds + dot(q * read, do, trans_a=True)
        dstate[...] = new

        if has_h0:
            @pl.when(first_ref[c] == 1)
            def _():
                dh0_ref[...] = new

        @pl.when(t == NT - 1)
        def _():
            dgamma_ref[...] = acc[...]


def fused_bwd(q, k, v, do, g_gamma, h0, dht, cfg: FusedConfig):
    """dq, dk [R, H, S, K]; dv [R, H, S, V] (input dtypes); dh0 [N, H, K, V] or None; dg_gamma [H]."""
    C, K, V, NT = cfg.C, cfg.K, cfg.V, cfg.NT
    at_chunk = lambda r, h, p, t, *s: (r, h, t + p * (NT - 1 - 2 * t), 0)       # phase 0: t; phase 1: NT-1-t
    dq_at = lambda r, h, p, t, *s: (r, h, t + p * (NT - 1 - t), 0)              # parked on NT-1 in phase 1
    dkv_at = lambda r, h, p, t, *s: (r, h, NT - 1 - t * p, 0)                  # parked on NT-1 in phase 0
    state_at = lambda r, h, p, t, seq, *s: (r + seq[t + p * (NT - 1 - 2 * t)], h, 0, 0)
    dh0_at = lambda r, h, p, t, seq, *s: (r + seq[NT - 1 - t * p], h, 0, 0)
    in_specs = [pl.BlockSpec((None, None, C, K), at_chunk), pl.BlockSpec((None, None, C, K), at_chunk),
                pl.BlockSpec((None, None, C, V), at_chunk), pl.BlockSpec((None, None, C, V), at_chunk),
                pl.BlockSpec((None, None, K, V), state_at)]
    args = [q, k, v, do, dht]
    out_specs = [pl.BlockSpec((None, None, C, K), dq_at), pl.BlockSpec((None, None, C, K), dkv_at),
                 pl.BlockSpec((None, None, C, V), dkv_at)]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                 jax.ShapeDtypeStruct(v.shape, v.dtype)]
    if cfg.has_h0:
        in_specs.append(pl.BlockSpec((None, None, K, V), state_at))
        args.append(h0)
        out_specs.append(pl.BlockSpec((None, None, K, V), dh0_at))
        out_shape.append(jax.ShapeDtypeStruct((cfg.N, cfg.H, K, V), F32))
    out_specs.append(pl.BlockSpec((None, None, 1, 1), lambda r, h, p, t, *s: (r, h, 0, 0)))
    out_shape.append(jax.ShapeDtypeStruct((cfg.R, cfg.H, 1, 1), F32))
    out = pl.pallas_call(
        functools.partial(_bwd_kernel, scale=cfg.scale, NT=NT, has_h0=cfg.has_h0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5, grid=(cfg.R, cfg.H, 2, NT), in_specs=in_specs, out_specs=out_specs,
            scratch_shapes=[pltpu.VMEM((K, V), F32)] * 3 + [pltpu.VMEM((1, 1), F32)]),
        out_shape=out_shape,
        compiler_params=params("parallel", "parallel", "arbitrary", "arbitrary"),
        interpret=interpret_mode(), name="simple_gla_fused_bwd",
    )(*cfg.prefetch(g_gamma), *args)
    dq, dk, dv = out[:3]
    dh0 = out[3] if cfg.has_h0 else None
    return dq, dk, dv, dh0, out[-1].sum(axis=(0, 2, 3))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def fused_core(q, k, v, g_gamma, h0, cfg: FusedConfig):
    """(o [R, H, S, V], ht [N, H, K, V] float32) on the chunked layout."""
    return fused_fwd(q, k, v, g_gamma, h0, cfg)


def _fused_core_fwd(q, k, v, g_gamma, h0, cfg):
    return fused_fwd(q, k, v, g_gamma, h0, cfg), (q, k, v, g_gamma, h0)


def _fused_core_bwd(cfg, res, cot):
    q, k, v, g_gamma, h0 = res
    do, dht = cot
    dq, dk, dv, dh0, dg_gamma = fused_bwd(q, k, v, do.astype(q.dtype), g_gamma, h0, dht.astype(F32), cfg)
    return dq, dk, dv, dg_gamma.astype(g_gamma.dtype), (None if h0 is None else dh0.astype(h0.dtype))


fused_core.defvjp(_fused_core_fwd, _fused_core_bwd)


def fused_chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                           output_final_state=False, cu_seqlens=None, chunk_size=64):
    """Simple GLA with per-head g_gamma [H], fused Pallas kernels (FLA's calling convention).

    q, k [B, T, H, K]; v [B, T, H, V]; g_gamma [H] float32 <= 0 (g must be None);
    initial_state [N, H, K, V]; cu_seqlens [N + 1] (B == 1). Returns o [B, T, H, V] in q's
    dtype and the final state [N, H, K, V] float32 (None unless output_final_state).
    Differentiable w.r.t. q, k, v, g_gamma and initial_state."""
    layout, scale = prepare(q, k, v, g, g_gamma, scale, initial_state, cu_seqlens, chunk_size, require_gamma=True)
    B, T, H, K = q.shape
    cfg = FusedConfig(R=layout.rows, H=H, K=K, V=v.shape[-1], C=layout.C, NT=layout.NT, N=layout.N, scale=scale,
                      tables=(layout.seq, layout.first, layout.last, layout.length),
                      has_h0=initial_state is not None)
    o, ht = _fused(q, k, v, g_gamma, initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(5, 6))
def _fused(q, k, v, g_gamma, initial_state, layout, cfg):
    qc, kc, vc = (chunking.to_chunks(x, layout) for x in (q, k, v))
    o, ht = fused_core(qc, kc, vc, g_gamma, initial_state, cfg)
    return chunking.from_chunks(o, layout), ht
