"""chunk_kda: Kimi Delta Attention by chunks (FLA's chunk_kda), the op as calls to its stage kernels.

Recurrence (references/kda.py), per sequence and value head, state S [K, V]:
    S' = diag(exp(g_t)) S_{t-1};  S_t = S' + (beta_t k_t)^T (v_t - k_t S');  o_t = scale q_t S_t
q and k are used as given (callers L2-normalise them, as FLA's chunk_kda expects by default).
Per chunk, with gk = chunk-local cumsum(g) / ln 2 (log2 units, as FLA's):
    forward   gk = local_cumsum(g); w, u, kg, Aqk, Akk = fwd_intra(q, k, v, gk, beta);
              h, v_new, ht = fwd_h(kg, w, u, gk, h0); o = fwd_o(q, v_new, gk, Aqk, h)
    backward  dAqk, dv = bwd_dAv(v_new, do, Aqk);
              dh, dh0, dv = bwd_dhu(q exp2(gk), kg, w, gk, dht, do, dv);
              dq, dk, dv, db, dg, dAkk = bwd_wy(q, k, v, v_new, gk, beta, Akk, h, do, dh, dv);
              dq, dk, db, dg = bwd_intra(q, k, gk, beta, dAqk, dAkk, dq, dk, db, dg);
              dg of the op's g: the reverse chunk-local cumsum of dg
Each stage is one Pallas kernel of kernels.py (local_cumsum: a compensated jnp scan), the same
functions the stage cases run through stages.py. The intermediates (w, u, kg, Aqk, Akk, h, v_new
and the backward's dv, dh) stay float32 (FLA keeps them in the input dtype). Grouped value heads
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
from .chunk_math import F32

ALIGN = 8  # head dims padded to whole sublanes


# ---------------------------------------------------------------- autodiff
# packed layout: q, k [H, P, K]; v [HV, P, V]; g [HV, P, K], beta [HV, P, 1], h0 [N, HV, K, V]
# float32; tables (seq, first, last, length) int32 [NT]
def _forward(q, k, v, g, beta, h0, tables, cfg: KernelConfig):
    """-> o [HV, P, V] in q's dtype, ht [N, HV, K, V], what the backward reads."""
    gk = packed_local_cumsum(g, cfg.C, RCP_LN2)
    w, u, kg, Aqk, Akk = kernels.intra(q, k, v, gk, beta, tables, cfg, F32)
    h, vn, ht = kernels.fwd_h(kg, w, u, gk, h0, tables, cfg, F32)
    o = kernels.fwd_o(q, vn, gk, Aqk, h, tables, cfg).astype(q.dtype)
    return o, ht, (gk, w, kg, Aqk, Akk, h, vn)


@functools.partial(jax.custom_vjp, nondiff_argnums=(10,))
def _kda_packed(q, k, v, g, beta, h0, seq, first, last, length, cfg: KernelConfig):
    """Packed forward -> (o [HV, P, V], ht [N, HV, K, V])."""
    o, ht, _ = _forward(q, k, v, g, beta, h0, (seq, first, last, length), cfg)
    return o, ht


def _kda_packed_fwd(q, k, v, g, beta, h0, seq, first, last, length, cfg):
    tables = (seq, first, last, length)
    o, ht, saved = _forward(q, k, v, g, beta, h0, tables, cfg)
    return (o, ht), (q, k, v, beta, saved, tables)


def _kda_packed_bwd(cfg, residuals, cotangents):
    q, k, v, beta, (gk, w, kg, Aqk, Akk, h, vn), tables = residuals
    do, dht = cotangents
    dAqk, dv = kernels.bwd_dAv(vn, do, Aqk, tables, cfg, F32)
    qg = jnp.repeat(q, cfg.G, axis=0) * kernels.exp2(gk)  # [HV, P, K], as FLA's backward recomputes it
    dh, dh0, dv = kernels.bwd_dhu(qg, kg, w, gk, dht.astype(F32), do, dv, tables, cfg, F32)
    dq, dk, dv, db, dg, dAkk = kernels.bwd_wy(q, k, v, vn, gk, beta, Akk, h, do, dh, dv, tables, cfg)
    dq, dk, db, dg = kernels.bwd_intra(q, k, gk, beta, dAqk, dAkk, dq, dk, db, dg, tables, cfg)
    dg = packed_local_cumsum(dg, cfg.C, reverse=True)  # w.r.t. the cumsum -> w.r.t. g
    dq, dk = cfg.sum_groups(dq), cfg.sum_groups(dk)  # per value head -> per q, k head
    return dq.astype(q.dtype), dk.astype(k.dtype), dv, dg, db, dh0, None, None, None, None


_kda_packed.defvjp(_kda_packed_fwd, _kda_packed_bwd)


# ---------------------------------------------------------------- public entry point
def chunk_kda(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """Kimi Delta Attention, chunked (FLA's chunk_kda convention).

    q, k [B, T, H, K] (L2-normalised by the caller), v [B, T, HV, V] (HV = G * H: value head j
    reads q, k head j // G); g [B, T, HV, K] per-channel log-decay; beta [B, T, HV];
    initial_state [N, HV, K, V] float32 (N = B, or the number of packed sequences with
    cu_seqlens [N + 1] and B == 1). Returns (o [B, T, HV, V] in q's dtype, final_state
    [N, HV, K, V] float32 or None).
    """
    layout, cfg = prepare(
        "kda",
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
    o, ht = _chunk_kda_jit(q, k, v, g, beta, initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(7,))
def _chunk_kda_jit(q, k, v, g, beta, initial_state, layout: ChunkLayout, cfg: KernelConfig):
    """The stages as one program: pack (K, V padded; g and beta in float32), the stages, unpack.
    -> (o [B, T, HV, V], final_state [N, HV, K, V] float32)."""
    h0 = jnp.zeros((cfg.N, cfg.HV, cfg.K, cfg.V), F32) if initial_state is None else cfg.pad_state(initial_state)
    o, ht = _kda_packed(
        layout.pack(q, cfg.K),
        layout.pack(k, cfg.K),
        layout.pack(v, cfg.V),
        layout.pack(g.astype(F32), cfg.K),
        layout.pack(beta.astype(F32)[..., None]),
        h0,
        *layout.tables(),
        jnp.asarray(layout.length, jnp.int32),
        cfg,
    )
    return layout.unpack(o, cfg.V_in), cfg.cut_state(ht)
