"""Simple GLA's chunk stages under FLA 0.6.0's names and keyword calling convention.

Each stage runs one of chunk.py's Pallas kernels (no kernel maths of its own): a thin adapter
that plans the layout on the host (kernels_jax/common/layout.py; cu_seqlens must be concrete),
packs FLA's [B, T, H, D] tensors into the kernels' head-major chunk layout [H, NT * C, D] (head
dims padded as chunk_simple_gla pads them), converts the gate and converts the results back.

Gates arrive in FLA 0.6.0's log2 units: g [B, T, H] is the chunk-local cumsum of the op's
log-decays times 1 / ln 2, g_gamma [H] the op's per-head log-decay times 1 / ln 2. The kernels
take natural-log decays b [H, NT, C] = g * ln 2 (the chunk-local cumsum; g_gamma * ln 2 times
the step count for g_gamma). A chunk's padding slots repeat the chunk's last real gate (the
kernels read the chunk's decay from its last slot). The dg of chunk_bwd_dqkwg is FLA's: the
gradient w.r.t. the chunk-local cumsum in natural-log units (FLA's kernel takes no ln 2 factor:
q.dq - k.dk per token, plus <h_c+1, dh_c> terms on the chunk's last real token), which is the
kernel's db [H, NT, C] gathered back to the tokens (padding slots' share added to the chunk's
last real token).

States: FLA's h, dh [B, NT, H, K, V] (NT chunks per row, or over all packed sequences with
B == 1; an empty sequence has none) <-> the kernels' [H, NT', K, V], rows or sequences packed in
order (an empty sequence has one chunk of padding there). Every function is jax.jit-compatible
for given static arguments (chunk_size, scale, output_final_state, a concrete cu_seqlens).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from kernels_jax.common import stage_layout
from kernels_jax.common.config import KernelConfig, prepare
from kernels_jax.common.layout import ChunkLayout
from kernels_jax.common.stage_layout import gate_slots, gate_sources, require_concrete, states_in, states_out

from . import chunk as kernels
from .chunk import ALIGN

F32 = jnp.float32
LN2 = math.log(2.0)  # log2-unit gates times ln 2: the kernels' natural-log decays


# ---------------------------------------------------------------------------------------------
# host-side planning


def _prepare(stage, q, k, v, *, g, g_gamma, scale=None, h0=None, cu_seqlens=None, chunk_size=64):
    """(layout, cfg, gate_src int32 [NT * C], keep int32 [NT_fla]) for one stage call.
    gate_src: the packed slot each slot's gate is read from (a padding slot reads its chunk's
    last real slot); keep: the kernels' chunks FLA counts (all but empty sequences' chunk)."""
    require_concrete(cu_seqlens, "simple_gla", stage)
    layout, cfg = prepare(
        "simple_gla",
        q,
        k,
        v,
        align=ALIGN,
        g=g,
        g_gamma=g_gamma,
        scale=scale,
        initial_state=h0,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    gate_src, keep = gate_sources(layout)
    return layout, cfg, gate_src, keep


# ---------------------------------------------------------------------------------------------
# conversions (traced)


def _gate_slots(g, layout: ChunkLayout, gate_src, H: int):
    """g [B, T, H] (any units) -> [H, NT, C] float32 on the packed slots, padding slots holding
    their chunk's last real value. Linear in g (its transpose gathers slot gradients back)."""
    return gate_slots(g[..., None], layout, gate_src)[..., 0].reshape(H, layout.NT, layout.C)


def _log_decay(g, g_gamma, layout: ChunkLayout, gate_src, H: int):
    """b [H, NT, C] float32: the kernels' natural-log chunk-local cumulative decay from FLA's
    log2-unit g [B, T, H] (already a chunk-local cumsum) or g_gamma [H], or zeros."""
    if g is not None:
        return _gate_slots(g, layout, gate_src, H) * LN2
    if g_gamma is not None:
        return kernels.chunk_log_decay(None, g_gamma.astype(F32) * LN2, layout, H)
    return jnp.zeros((H, layout.NT, layout.C), F32)


# ---------------------------------------------------------------------------------------------
# local_cumsum


def chunk_local_cumsum(g, chunk_size, scale=None, reverse=False, cu_seqlens=None, **unused):
    """g [B, T, H] -> g_cumsum [B, T, H] float32: the cumsum of g within each chunk (each
    sequence's chunks start at its first token; reversed: from each chunk's end), times scale
    when given. A compensated jnp scan on the packed layout (stage_layout.compensated_cumsum): not a
    Pallas kernel in this port (the whole-op path cumsums in chunk.chunk_log_decay)."""
    return stage_layout.chunk_local_cumsum("simple_gla", g, chunk_size, scale, reverse, cu_seqlens)


# ---------------------------------------------------------------------------------------------
# fwd_h


def chunk_fwd_h(
    k, v, g=None, g_gamma=None, h0=None, output_final_state=False, cu_seqlens=None, chunk_size=64, **unused
):
    """k [B, T, H, K], v [B, T, H, V], g [B, T, H] or g_gamma [H] (log2 units), h0 [N, H, K, V] ->
    (h [B, NT, H, K, V] in k's dtype: the state before each chunk, ht [N, H, K, V] float32: the
    state after each sequence, or None unless output_final_state). Kernel: chunk.chunk_fwd_h."""
    layout, cfg, gate_src, keep = _prepare(
        "chunk_fwd_h", k, k, v, g=g, g_gamma=g_gamma, h0=h0, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    h, ht = _fwd_h(k, v, g, g_gamma, h0, layout, gate_src, keep, cfg)
    return h, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(8,))
def _fwd_h(k, v, g, g_gamma, h0, layout, gate_src, keep, cfg: KernelConfig):
    b = _log_decay(g, g_gamma, layout, gate_src, cfg.H)
    h0p = None if h0 is None else cfg.pad_state(h0)
    h, ht = kernels.chunk_fwd_h(layout.pack(k, cfg.K), layout.pack(v, cfg.V), b, h0p, layout.tables(), cfg)
    return states_out(h, layout, keep, cfg).astype(k.dtype), cfg.cut_state(ht)


# ---------------------------------------------------------------------------------------------
# fwd_o


def chunk_fwd_o(q, k, v, h, g=None, g_gamma=None, scale=None, cu_seqlens=None, chunk_size=64, **unused):
    """q, k [B, T, H, K], v [B, T, H, V], h [B, NT, H, K, V] (the state before each chunk),
    g [B, T, H] or g_gamma [H] (log2 units) -> o [B, T, H, V] in v's dtype. Kernel:
    chunk.chunk_fwd_o."""
    layout, cfg, gate_src, keep = _prepare(
        "chunk_fwd_o", q, k, v, g=g, g_gamma=g_gamma, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    return _fwd_o(q, k, v, h, g, g_gamma, layout, gate_src, keep, cfg)


@functools.partial(jax.jit, static_argnums=(9,))
def _fwd_o(q, k, v, h, g, g_gamma, layout, gate_src, keep, cfg: KernelConfig):
    b = _log_decay(g, g_gamma, layout, gate_src, cfg.H)
    qp, kp, vp = layout.pack(q, cfg.K), layout.pack(k, cfg.K), layout.pack(v, cfg.V)
    o = kernels.chunk_fwd_o(qp, kp, vp, states_in(h.astype(F32), layout, keep, cfg), b, cfg)
    return layout.unpack(o, cfg.V_in).astype(v.dtype)


# ---------------------------------------------------------------------------------------------
# bwd_dh


def chunk_bwd_dh(q, k, v, do, h0, dht, scale, g=None, g_gamma=None, cu_seqlens=None, chunk_size=64, **unused):
    """q, k [B, T, H, K], v, do [B, T, H, V], h0 [N, H, K, V] or None (only whether dh0 is
    wanted), dht [N, H, K, V] or None (zeros), g [B, T, H] or g_gamma [H] (log2 units) ->
    (dh [B, NT, H, K, V] float32: the gradient w.r.t. the state after each chunk from the chunks
    after it and dht, dh0 [N, H, K, V] float32 or None without h0). Kernel: chunk.chunk_bwd_dh."""
    layout, cfg, gate_src, keep = _prepare(
        "chunk_bwd_dh",
        q,
        k,
        v,
        g=g,
        g_gamma=g_gamma,
        scale=scale,
        h0=h0,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    return _bwd_dh(q, do, dht, g, g_gamma, layout, gate_src, keep, cfg)


@functools.partial(jax.jit, static_argnums=(8,))
def _bwd_dh(q, do, dht, g, g_gamma, layout, gate_src, keep, cfg: KernelConfig):
    b = _log_decay(g, g_gamma, layout, gate_src, cfg.H)
    dhtp = jnp.zeros((cfg.N, cfg.H, cfg.K, cfg.V), F32) if dht is None else cfg.pad_state(dht)
    qp, dop = layout.pack(q, cfg.K), layout.pack(do.astype(q.dtype), cfg.V)
    dh, dh0 = kernels.chunk_bwd_dh(qp, dop, b, dhtp, layout.tables(), cfg)
    return states_out(dh, layout, keep, cfg), (None if dh0 is None else cfg.cut_state(dh0))


# ---------------------------------------------------------------------------------------------
# bwd_dv


def chunk_bwd_dv(q, k, do, dh, g=None, g_gamma=None, scale=None, cu_seqlens=None, chunk_size=64, **unused):
    """q, k [B, T, H, K], do [B, T, H, V], dh [B, NT, H, K, V] (as chunk_bwd_dh returns it),
    g [B, T, H] or g_gamma [H] (log2 units) -> dv [B, T, H, V] in do's dtype. Kernel:
    chunk.chunk_bwd_dv."""
    layout, cfg, gate_src, keep = _prepare(
        "chunk_bwd_dv", q, k, do, g=g, g_gamma=g_gamma, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    return _bwd_dv(q, k, do, dh, g, g_gamma, layout, gate_src, keep, cfg)


@functools.partial(jax.jit, static_argnums=(9,))
def _bwd_dv(q, k, do, dh, g, g_gamma, layout, gate_src, keep, cfg: KernelConfig):
    b = _log_decay(g, g_gamma, layout, gate_src, cfg.H)
    qp, kp, dop = layout.pack(q, cfg.K), layout.pack(k, cfg.K), layout.pack(do.astype(q.dtype), cfg.V)
    dv = kernels.chunk_bwd_dv(qp, kp, dop, states_in(dh.astype(F32), layout, keep, cfg), b, cfg, do.dtype)
    return layout.unpack(dv, cfg.V_in)


# ---------------------------------------------------------------------------------------------
# bwd_dqkwg


def chunk_bwd_dqkwg(
    q,
    k,
    v,
    do,
    h,
    dh,
    w=None,
    g=None,
    g_gamma=None,
    dv=None,
    scale=None,
    cu_seqlens=None,
    chunk_size=64,
    **unused,
):
    """q, k [B, T, H, K], v, do [B, T, H, V], h, dh [B, NT, H, K, V], g [B, T, H] or g_gamma [H]
    (log2 units) -> (dq, dk [B, T, H, K] in q's dtype, None (dw: simple_gla has no w),
    dg [B, T, H] float32 or None without g: the gradient w.r.t. the chunk-local cumsum in
    natural-log units, before FLA's reverse cumsum). Kernel: chunk.chunk_bwd_dqk."""
    if w is not None or dv is not None:
        raise ValueError("simple_gla chunk_bwd_dqkwg: w and dv must be None (simple_gla has no delta rule)")
    layout, cfg, gate_src, keep = _prepare(
        "chunk_bwd_dqkwg", q, k, v, g=g, g_gamma=g_gamma, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    dq, dk, dg = _bwd_dqkwg(q, k, v, do, h, dh, g, g_gamma, layout, gate_src, keep, cfg)
    return dq, dk, None, dg


@functools.partial(jax.jit, static_argnums=(11,))
def _bwd_dqkwg(q, k, v, do, h, dh, g, g_gamma, layout, gate_src, keep, cfg: KernelConfig):
    b = _log_decay(g, g_gamma, layout, gate_src, cfg.H)
    qp, kp = layout.pack(q, cfg.K), layout.pack(k, cfg.K)
    vp, dop = layout.pack(v, cfg.V), layout.pack(do.astype(q.dtype), cfg.V)
    hp, dhp = states_in(h.astype(F32), layout, keep, cfg), states_in(dh.astype(F32), layout, keep, cfg)
    dq, dk, db = kernels.chunk_bwd_dqk(qp, kp, vp, dop, hp, dhp, b, cfg)
    dq = layout.unpack(dq, cfg.K_in).astype(q.dtype)
    dk = layout.unpack(dk, cfg.K_in).astype(q.dtype)
    if g is None:
        return dq, dk, None
    # db is w.r.t. b = slots(g) * ln 2 in natural-log units, FLA's dg: the transpose of the slot
    # gather (no ln 2 factor) takes it back to the tokens
    _, gather_t = jax.vjp(lambda x: _gate_slots(x, layout, gate_src, cfg.H), g.astype(F32))
    (dg,) = gather_t(db)
    return dq, dk, dg
