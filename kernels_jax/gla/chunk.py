"""Chunked GLA (per-channel log-decay g), FLA's chunk_gla: the op as calls to its stage kernels.

Recurrence (per sequence and head; S_t [K, V] float32, S_0 = initial_state or 0):
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t,        o_t = scale * q_t S_t
Per chunk of C tokens, with gc = chunk-local cumsum(g) / ln 2 (log2 units, as FLA's) and h the
state at the chunk start:
    forward   gc = local_cumsum(g); h, ht = fwd_h(k, v, gc, h0); A = fwd_intra(q, k, gc);
              o = fwd_o(q, v, gc, A, h) = scale (q exp2(gc)) h + tril(A) v
    backward  dh, dh0 = bwd_dh(q, do, gc, dht); dv = bwd_dv(k, gc, A, do, dh);
              dA = bwd_dA(v, do); dq, dk = bwd_dqk_intra(q, k, gc, dA);
              dq, dk, dg = bwd_dqkg(q, k, v, h, gc, do, dh, dq, dk)
Each stage is one Pallas kernel of kernels.py (local_cumsum: a compensated jnp scan), the same
functions the stage cases run through stages.py, so a stage case judges the op's own code.
Shapes (FLA layout): q, k, g [B, T, H, K]; v [B, T, H, V]; states [N, H, K, V] float32; the
kernels see the packed layout of common/layout.py with K and V padded to multiples of ALIGN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels_jax.common.config import KernelConfig, prepare
from kernels_jax.common.layout import ChunkLayout
from kernels_jax.common.stage_layout import RCP_LN2, packed_local_cumsum

from . import kernels
from .kernels import ALIGN, F32


# ---------------------------------------------------------------- autodiff
def _forward(q, k, v, g, h0, tables, cfg: KernelConfig):
    """-> o [H, NT * C, V] in q's dtype, ht [N, H, K, V], (gc, A, h) for the backward."""
    NT, C, scale = cfg.NT, cfg.C, cfg.scale
    gc = packed_local_cumsum(g, C, RCP_LN2)  # log2 units, as FLA's
    h, ht = kernels.fwd_h(k, v, gc, h0, tables, NT, C)
    A = kernels.fwd_intra(q, k, gc, NT, C, scale)
    o = kernels.fwd_o(q, v, gc, A, h, NT, C, scale, q.dtype)
    return o, ht, (gc, A, h)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _gla_packed(q, k, v, g, h0, seq, first, last, cfg: KernelConfig):
    """Packed forward -> (o [H, NT * C, V], ht [N, H, K, V])."""
    o, ht, _ = _forward(q, k, v, g, h0, (seq, first, last), cfg)
    return o, ht


def _gla_packed_fwd(q, k, v, g, h0, seq, first, last, cfg):
    o, ht, (gc, A, h) = _forward(q, k, v, g, h0, (seq, first, last), cfg)
    return (o, ht), (q, k, v, gc, A, h, (seq, first, last))


def _gla_packed_bwd(cfg, residuals, cotangents):
    q, k, v, gc, A, h, tables = residuals
    do, dht = cotangents
    NT, C, scale = cfg.NT, cfg.C, cfg.scale
    do = do.astype(v.dtype)
    dh, dh0 = kernels.bwd_dh(q, do, gc, dht.astype(F32), tables, NT, C, scale)
    dv = kernels.bwd_dv(k, gc, A, do, dh, NT, C, v.dtype)
    dA = kernels.bwd_da(v, do, NT, C, scale)
    dq, dk = kernels.bwd_dqk_intra(q, k, gc, dA, NT, C)
    dq, dk, dg = kernels.bwd_dqkg(q, k, v, h, gc, do, dh, dq, dk, NT, C, scale)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv, dg, dh0, None, None, None


_gla_packed.defvjp(_gla_packed_fwd, _gla_packed_bwd)


# ---------------------------------------------------------------- public entry point
def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64):
    """GLA with per-channel log-decay, chunked Pallas kernels (FLA's chunk_gla convention).

    q, k, g [B, T, H, K]; v [B, T, H, V] (q, k, v float32 or bfloat16; g any float, used
    in float32); initial_state [N, H, K, V]; cu_seqlens int [N + 1] with B == 1 (varlen).
    Returns (o [B, T, H, V] in q's dtype, final_state [N, H, K, V] float32 or None).
    Differentiable in q, k, v, g and initial_state.
    """
    layout, cfg = prepare(
        "gla",
        q,
        k,
        v,
        align=ALIGN,
        g=g,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    o, ht = _chunk_gla_jit(q, k, v, g, initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(6,))
def _chunk_gla_jit(q, k, v, g, initial_state, layout: ChunkLayout, cfg: KernelConfig):
    """The stages as one program: pack (K, V padded), the stages, unpack.
    -> (o [B, T, H, V], final_state [N, H, K, V] float32)."""
    h0 = jnp.zeros((cfg.N, cfg.H, cfg.K, cfg.V), F32) if initial_state is None else cfg.pad_state(initial_state)
    o, ht = _gla_packed(
        layout.pack(q, cfg.K),
        layout.pack(k, cfg.K),
        layout.pack(v, cfg.V),
        layout.pack(g.astype(F32), cfg.K),
        h0,
        *layout.tables(),
        cfg,
    )
    return layout.unpack(o, cfg.V_in), cfg.cut_state(ht)
