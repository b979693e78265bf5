"""GDN's chunk stages under FLA 0.6.0's names and keyword calling convention (cases/stages/gdn.py).

Each stage runs one Pallas kernel of kernels.py, the op's own (chunk.py calls the same functions;
local_cumsum: a compensated jnp scan, as the op computes it): a thin adapter that plans the layout
on the host (kernels_jax/common/layout.py; cu_seqlens must be concrete), packs FLA's [B, T, H, D]
tensors into the kernels' head-major chunk layout [H or HV, NT * C, D] (head dims padded to
multiples of 8), converts the gate and converts the results back (dq, dk, dk2 summed over each
q, k head's G value heads, as FLA sums them).

Gates arrive in FLA 0.6.0's log2 units: g [B, T, HV] is the chunk-local cumsum of the op's
log-decays times 1 / ln 2; the kernels take it as it is (scaling exponent differences by ln 2),
a chunk's padding slots repeating its last real value. dg (bwd_dqkwg) and dg2 (bwd_wy) are FLA's:
gradients w.r.t. the cumsum in natural-log units, as the kernels compute them.

States: FLA's h, dh [B, NT, HV, K, V] (NT chunks per row, or over all packed sequences with
B == 1; an empty sequence has none) <-> the kernels' [HV, NT', K, V] (an empty sequence has one
chunk of padding there). Every function is jax.jit-compatible for given static arguments
(chunk_size, scale, output_final_state, a concrete cu_seqlens).
"""

from __future__ import annotations

import dataclasses

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
from .chunk import ALIGN, F32


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class _Plan:
    """One stage call's layout (a pytree), kernel config (static) and host tables: gate_src int32
    [NT * C] (the slot each slot's gate is read from: a padding slot reads its chunk's last real
    slot), keep int32 [NT_fla] (the kernels' chunks FLA counts: all but empty sequences'),
    length int32 [NT] (real slots per chunk)."""

    layout: ChunkLayout
    cfg: KernelConfig
    gate_src: object
    keep: object
    length: object

    def tree_flatten(self):
        return (self.layout, self.gate_src, self.keep, self.length), self.cfg

    @classmethod
    def tree_unflatten(cls, cfg, children):
        layout, gate_src, keep, length = children
        return cls(layout, cfg, gate_src, keep, length)


def _plan(stage, k, v, *, cu_seqlens, chunk_size, scale=None, has_h0=False) -> _Plan:
    """The plan of a stage call from k [B, T, H, K] and a value-head tensor v [B, T, HV, V]: the
    op's own entry contract and config (config.prepare, on shapes alone)."""
    require_concrete(cu_seqlens, "gdn", stage)
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    sds = jax.ShapeDtypeStruct
    qk, per_token = sds((B, T, H, K), k.dtype), sds((B, T, HV), F32)
    layout, cfg = prepare(
        "gdn",
        qk,
        qk,
        sds((B, T, HV, V), k.dtype),
        align=ALIGN,
        g=per_token,
        beta=per_token,
        scale=scale,
        initial_state=sds((N, HV, K, V), F32) if has_h0 else None,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    gate_src, keep = gate_sources(layout)
    return _Plan(layout, cfg, gate_src, keep, jnp.asarray(np.asarray(layout.length), jnp.int32))


# ---------------------------------------------------------------------------------------------
# conversions (traced)


def _qk(p: _Plan, x):
    """q or k [B, T, H, K] -> [H, P, K_pad] (value head h reads head h // G)."""
    return p.layout.pack(x, p.cfg.K)


def _keys(p: _Plan, x):
    """w-like [B, T, HV, K] -> [HV, P, K_pad]."""
    return p.layout.pack(x, p.cfg.K)


def _values(p: _Plan, x):
    """[B, T, HV, V] -> [HV, P, V_pad]."""
    return p.layout.pack(x, p.cfg.V)


def _column(p: _Plan, x):
    """[B, T, HV] -> [HV, P, 1] float32 (padding 0)."""
    return p.layout.pack(x.astype(F32)[..., None])


def _log_decay(p: _Plan, g):
    """FLA's log2 chunk-local cumsum g [B, T, HV] -> b [HV, P, 1] (log2 units, as the kernels take
    it), padding slots holding their chunk's last real value."""
    return gate_slots(g[..., None], p.layout, p.gate_src)


def _A_in(p: _Plan, A):
    """FLA's A [B, T, HV, C] -> [HV, P, C]."""
    return p.layout.pack(A)


def _tokens(p: _Plan, x, width: int):
    """[HV, P, D] -> [B, T, HV, width]."""
    return p.layout.unpack(x, width)


def _group_sum(p: _Plan, x):
    """per value head [HV, P, K_pad] -> [B, T, H, K]: summed over each q, k head's G value heads."""
    y = _tokens(p, x, p.cfg.K_in)
    B, T, HV, K = y.shape
    return y.reshape(B, T, HV // p.cfg.G, p.cfg.G, K).sum(3)


# ---------------------------------------------------------------------------------------------
# local_cumsum (XLA)


def chunk_local_cumsum(g, chunk_size, scale=None, reverse=False, cu_seqlens=None, **unused):
    """g [B, T, HV] -> g_cumsum [B, T, HV] float32: the cumsum of g within each chunk (each
    sequence's chunks start at its first token; reversed: from each chunk's end), times scale
    when given. A compensated jnp scan on the packed layout (parity.model.kernels.XLA_STAGES)."""
    return stage_layout.chunk_local_cumsum("gdn", g, chunk_size, scale, reverse, cu_seqlens)


# ---------------------------------------------------------------------------------------------
# fwd_intra


def chunk_gated_delta_rule_fwd_intra(k, v, g=None, beta=None, cu_seqlens=None, chunk_size=64, **unused):
    """k [B, T, H, K], v [B, T, HV, V], g [B, T, HV] (log2 cumsum), beta [B, T, HV] ->
    (w [B, T, HV, K] in k's dtype, u [B, T, HV, V] in v's dtype, A [B, T, HV, C] in k's dtype:
    per chunk (I + M)^-1, M_ij = beta_i (k_i . k_j) exp2(g_i - g_j) for j < i).
    Kernel: kernels.fwd_intra."""
    p = _plan("chunk_gated_delta_rule_fwd_intra", k, v, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    return _fwd_intra(k, v, g, beta, p)


@jax.jit
def _fwd_intra(k, v, g, beta, p: _Plan):
    w, u, A = kernels.fwd_intra(_qk(p, k), _values(p, v), _column(p, beta), _log_decay(p, g), p.cfg)
    return _tokens(p, w, p.cfg.K_in), _tokens(p, u, p.cfg.V_in), _tokens(p, A, p.cfg.C)


# ---------------------------------------------------------------------------------------------
# fwd_h, fwd_o


def chunk_gated_delta_rule_fwd_h(
    k, w, u, g=None, gk=None, initial_state=None, output_final_state=False, chunk_size=64, cu_seqlens=None, **unused
):
    """k [B, T, H, K], w [B, T, HV, K], u [B, T, HV, V], g (log2 cumsum), initial_state
    [N, HV, K, V] or None -> (h [B, NT, HV, K, V] in k's dtype: the state before each chunk,
    v_new [B, T, HV, V] in u's dtype: u - w h, ht [N, HV, K, V] float32 or None unless
    output_final_state). Kernel: kernels.fwd_h."""
    if gk is not None:
        raise ValueError("gdn chunk_gated_delta_rule_fwd_h: gk (per-channel gates) is not a gdn stage input")
    p = _plan(
        "chunk_gated_delta_rule_fwd_h",
        k,
        u,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
        has_h0=initial_state is not None,
    )
    h, v_new, ht = _fwd_h(k, w, u, g, initial_state, p)
    return h, v_new, (ht if output_final_state else None)


@jax.jit
def _fwd_h(k, w, u, g, h0, p: _Plan):
    h0p = None if h0 is None else p.cfg.pad_state(h0)
    tables = p.layout.tables()
    h, vn, ht = kernels.fwd_h(_qk(p, k), _keys(p, w), _values(p, u), _log_decay(p, g), h0p, tables, p.cfg)
    return states_out(h, p.layout, p.keep, p.cfg), _tokens(p, vn, p.cfg.V_in), p.cfg.cut_state(ht)


def chunk_fwd_o(q, k, v, h, g=None, g_gamma=None, scale=None, cu_seqlens=None, chunk_size=64, **unused):
    """q, k [B, T, H, K], v (v_new) [B, T, HV, V], h [B, NT, HV, K, V], g (log2 cumsum) ->
    o [B, T, HV, V] in v's dtype. Kernel: kernels.fwd_o."""
    if g_gamma is not None:
        raise ValueError("gdn chunk_fwd_o: g_gamma is not a gdn gate (gdn gates with g)")
    p = _plan("chunk_fwd_o", k, v, cu_seqlens=cu_seqlens, chunk_size=chunk_size, scale=scale)
    return _fwd_o(q, k, v, h, g, p)


@jax.jit
def _fwd_o(q, k, v, h, g, p: _Plan):
    o = kernels.fwd_o(
        _qk(p, q), _qk(p, k), _values(p, v), states_in(h, p.layout, p.keep, p.cfg), _log_decay(p, g), p.cfg
    )
    return _tokens(p, o, p.cfg.V_in)


# ---------------------------------------------------------------------------------------------
# bwd_dv_local, bwd_dhu


def chunk_bwd_dv_local(q, k, do, g=None, g_gamma=None, A=None, scale=None, cu_seqlens=None, chunk_size=64, **unused):
    """q, k [B, T, H, K], do [B, T, HV, V], g (log2 cumsum) -> dv [B, T, HV, V] in do's dtype:
    dv_j = scale sum_{i>=j} exp2(g_i - g_j) (q_i . k_j) do_i. Kernel: kernels.bwd_dv_local."""
    if g_gamma is not None or A is not None:
        raise ValueError("gdn chunk_bwd_dv_local: g_gamma and A are not gdn stage inputs")
    p = _plan("chunk_bwd_dv_local", k, do, cu_seqlens=cu_seqlens, chunk_size=chunk_size, scale=scale)
    return _bwd_dv_local(q, k, do, g, p)


@jax.jit
def _bwd_dv_local(q, k, do, g, p: _Plan):
    dv = kernels.bwd_dv_local(_qk(p, q), _qk(p, k), _values(p, do), _log_decay(p, g), p.cfg)
    return _tokens(p, dv, p.cfg.V_in)


def chunk_gated_delta_rule_bwd_dhu(
    q, k, w, do, dv, g=None, gk=None, h0=None, dht=None, scale=None, cu_seqlens=None, chunk_size=64, **unused
):
    """q, k [B, T, H, K], w [B, T, HV, K], do, dv [B, T, HV, V] (dv: bwd_dv_local's), g (log2
    cumsum), h0 [N, HV, K, V] or None (only whether dh0 is wanted), dht [N, HV, K, V] or None
    (zeros) -> (dh [B, NT, HV, K, V] in q's dtype: the gradient w.r.t. the state after each chunk,
    dh0 [N, HV, K, V] float32 or None without h0, dv2 [B, T, HV, V] in dv's dtype).
    Kernel: kernels.bwd_dhu."""
    if gk is not None:
        raise ValueError("gdn chunk_gated_delta_rule_bwd_dhu: gk (per-channel gates) is not a gdn stage input")
    p = _plan(
        "chunk_gated_delta_rule_bwd_dhu",
        k,
        do,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
        scale=scale,
        has_h0=h0 is not None,
    )
    return _bwd_dhu(q, k, w, do, dv, g, dht, p)


@jax.jit
def _bwd_dhu(q, k, w, do, dv, g, dht, p: _Plan):
    tables = p.layout.tables()
    dh, dv2, dh0 = kernels.bwd_dhu(
        _qk(p, q),
        _qk(p, k),
        _keys(p, w),
        _values(p, do),
        _values(p, dv),
        _log_decay(p, g),
        seq_states(dht, p.cfg),
        tables,
        p.cfg,
    )
    dh0 = None if dh0 is None else p.cfg.cut_state(dh0)
    return states_out(dh, p.layout, p.keep, p.cfg), dh0, _tokens(p, dv2, p.cfg.V_in)


# ---------------------------------------------------------------------------------------------
# bwd_dqkwg, bwd_wy


def chunk_bwd_dqkwg(
    q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, scale=None, cu_seqlens=None, chunk_size=64, **unused
):
    """q, k [B, T, H, K], v (v_new), do, dv (bwd_dhu's dv2) [B, T, HV, V], h, dh [B, NT, HV, K, V],
    w [B, T, HV, K], g (log2 cumsum) -> (dq [B, T, H, K] in q's dtype, dk in k's dtype (summed over
    each group of value heads), dw [B, T, HV, K] in w's dtype = -dv2 h^T, dg [B, T, HV] float32:
    the gradient w.r.t. the natural-log cumsum). Kernel: kernels.bwd_dqkwg."""
    if w is None or dv is None or g is None or g_gamma is not None:
        raise ValueError("gdn chunk_bwd_dqkwg: takes w, dv and g (the delta rule's stage), not g_gamma")
    p = _plan("chunk_bwd_dqkwg", k, v, cu_seqlens=cu_seqlens, chunk_size=chunk_size, scale=scale)
    return _bwd_dqkwg(q, k, v, do, h, dh, w, g, dv, p)


@jax.jit
def _bwd_dqkwg(q, k, v, do, h, dh, w, g, dv, p: _Plan):
    dq, dk, dw, dg = kernels.bwd_dqkwg(
        _qk(p, q),
        _qk(p, k),
        _values(p, v),
        _values(p, do),
        _values(p, dv),
        states_in(h, p.layout, p.keep, p.cfg),
        states_in(dh, p.layout, p.keep, p.cfg),
        _log_decay(p, g),
        p.length,
        p.cfg,
        w.dtype,
    )
    dq, dk = _group_sum(p, dq).astype(q.dtype), _group_sum(p, dk).astype(k.dtype)
    return dq, dk, _tokens(p, dw, p.cfg.K_in), _tokens(p, dg, 1)[..., 0]


def prepare_wy_repr_bwd(k, v, beta, A, dw, du, g=None, cu_seqlens=None, chunk_size=None, **unused):
    """k [B, T, H, K], v, du [B, T, HV, V] (du: bwd_dhu's dv2), beta [B, T, HV], A [B, T, HV, C]
    (fwd_intra's), dw [B, T, HV, K] (bwd_dqkwg's), g (log2 cumsum) -> (dk2 [B, T, H, K] in k's dtype
    (summed over each group), dv [B, T, HV, V] in v's dtype, db [B, T, HV] in beta's dtype,
    dg2 [B, T, HV] float32: the gradient w.r.t. the natural-log cumsum). The chunk size is A's last
    axis (FLA's function takes none; a chunk_size given must agree). Kernel: kernels.bwd_wy."""
    C = A.shape[-1]
    if chunk_size is not None and chunk_size != C:
        raise ValueError(f"gdn prepare_wy_repr_bwd: chunk_size={chunk_size} but A has {C} columns")
    p = _plan("prepare_wy_repr_bwd", k, v, cu_seqlens=cu_seqlens, chunk_size=C)
    return _bwd_wy(k, v, beta, A, dw, du, g, p)


@jax.jit
def _bwd_wy(k, v, beta, A, dw, du, g, p: _Plan):
    dk, dv, db, dg = kernels.bwd_wy(
        _qk(p, k),
        _values(p, v),
        _column(p, beta),
        _A_in(p, A),
        _keys(p, dw),
        _values(p, du),
        _log_decay(p, g),
        p.cfg,
    )
    dk2 = _group_sum(p, dk).astype(k.dtype)
    return dk2, _tokens(p, dv, p.cfg.V_in), _tokens(p, db, 1)[..., 0].astype(beta.dtype), _tokens(p, dg, 1)[..., 0]
