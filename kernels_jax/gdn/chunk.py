"""chunk_gdn: the gated delta rule by chunks (FLA's chunk_gated_delta_rule), the op as calls to its
stage kernels.

Recurrence (references/gdn.py), per sequence and value head, state S [K, V]:
    S' = exp(g_t) S_{t-1};  S_t = S' + (beta_t k_t)^T (v_t - k_t S');  o_t = scale q_t S_t
Per chunk, with b = chunk-local cumsum(g) / ln 2 (log2 units, as FLA's):
    forward   b = local_cumsum(g); w, u, A = fwd_intra(k, v, beta, b);
              h, v_new, ht = fwd_h(k, w, u, b, h0); o = fwd_o(q, k, v_new, h, b)
    backward  dv = bwd_dv_local(q, k, do, b); dh, dv2, dh0 = bwd_dhu(q, k, w, do, dv, b, dht);
              dq, dk, dw, dg = bwd_dqkwg(q, k, v_new, do, dv2, h, dh, b);
              dk2, dv, dbeta, dg2 = bwd_wy(k, v, beta, A, dw, dv2, b);
              dg of the op's g: the reverse chunk-local cumsum of dg + dg2
Each stage is one Pallas kernel of kernels.py (local_cumsum: a compensated jnp scan), the same
functions the stage cases run through stages.py. The intermediates (w, u, A, h, v_new and the
backward's dv, dh) stay float32 (FLA keeps them in the input dtype). Grouped value heads
(HV = G * H): the kernels run per value head and read q, k head h // G; dq, dk are summed over
each group here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels_jax.common.config import KernelConfig, prepare
from kernels_jax.common.layout import ChunkLayout
from kernels_jax.common.stage_layout import RCP_LN2, packed_local_cumsum

from . import kernels

F32 = jnp.float32
ALIGN = 8  # head dims padded to whole sublanes


# ---------------------------------------------------------------- autodiff
# packed layout: q, k [H, P, K]; v [HV, P, V]; g, beta [HV, P, 1] float32; h0 [N, HV, K, V] or None
def _forward(q, k, v, g, beta, h0, tables, cfg: KernelConfig):
    """-> o [HV, P, V] in q's dtype, ht [N, HV, K, V], (b, w, A, h, v_new) for the backward."""
    b = packed_local_cumsum(g, cfg.C, RCP_LN2)
    w, u, A = kernels.fwd_intra(k, v, beta, b, cfg, F32)
    h, vn, ht = kernels.fwd_h(k, w, u, b, h0, tables, cfg, F32)
    o = kernels.fwd_o(q, k, vn, h, b, cfg, q.dtype)
    return o, ht, (b, w, A, h, vn)


@functools.partial(jax.custom_vjp, nondiff_argnums=(10,))
def _gdn_packed(q, k, v, g, beta, h0, seq, first, last, length, cfg: KernelConfig):
    """Packed forward -> (o [HV, P, V], ht [N, HV, K, V])."""
    o, ht, _ = _forward(q, k, v, g, beta, h0, (seq, first, last), cfg)
    return o, ht


def _gdn_packed_fwd(q, k, v, g, beta, h0, seq, first, last, length, cfg):
    o, ht, saved = _forward(q, k, v, g, beta, h0, (seq, first, last), cfg)
    return (o, ht), (q, k, v, beta, saved, (seq, first, last), length)


def _gdn_packed_bwd(cfg, residuals, cotangents):
    q, k, v, beta, (b, w, A, h, vn), tables, length = residuals
    do, dht = cotangents
    dv = kernels.bwd_dv_local(q, k, do, b, cfg, F32)
    dh, dv2, dh0 = kernels.bwd_dhu(q, k, w, do, dv, b, dht.astype(F32), tables, cfg, F32)
    dq, dk, dw, dg = kernels.bwd_dqkwg(q, k, vn, do, dv2, h, dh, b, length, cfg, F32)
    dk2, dv, dbeta, dg2 = kernels.bwd_wy(k, v, beta, A, dw, dv2, b, cfg)
    dg = packed_local_cumsum(dg + dg2, cfg.C, reverse=True)  # w.r.t. the cumsum -> w.r.t. g
    dq, dk = cfg.sum_groups(dq), cfg.sum_groups(dk + dk2)  # per value head -> per q, k head
    return dq.astype(q.dtype), dk.astype(k.dtype), dv, dg, dbeta, dh0, None, None, None, None


_gdn_packed.defvjp(_gdn_packed_fwd, _gdn_packed_bwd)


# ---------------------------------------------------------------- public entry point
def chunk_gdn(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """Gated delta rule, chunked (FLA's chunk_gated_delta_rule convention).

    q, k [B, T, H, K] (L2-normalised by the caller), v [B, T, HV, V] (HV = G * H: value head j
    reads q, k head j // G); g [B, T, HV] per-head log-decay; beta [B, T, HV]; initial_state
    [N, HV, K, V] float32 (N = B, or the number of packed sequences with cu_seqlens [N + 1] and
    B == 1). Returns (o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None).
    """
    layout, cfg = prepare(
        "gdn",
        q,
        k,
        v,
        align=ALIGN,
        g=g,
        beta=beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    o, ht = _chunk_gdn_jit(q, k, v, g, beta, initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(7,))
def _chunk_gdn_jit(q, k, v, g, beta, initial_state, layout: ChunkLayout, cfg: KernelConfig):
    """The stages as one program: pack (K, V padded; g and beta float32 columns), the stages,
    unpack. -> (o [B, T, HV, V], final_state [N, HV, K, V] float32)."""
    column = lambda x: layout.pack(x.astype(F32)[..., None])  # noqa: E731
    h0 = None if initial_state is None else cfg.pad_state(initial_state)
    o, ht = _gdn_packed(
        layout.pack(q, cfg.K),
        layout.pack(k, cfg.K),
        layout.pack(v, cfg.V),
        column(g),
        column(beta),
        h0,
        *layout.tables(),
        jnp.asarray(layout.length, jnp.int32),
        cfg,
    )
    return layout.unpack(o, cfg.V_in), cfg.cut_state(ht)
