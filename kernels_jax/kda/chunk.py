"""chunk_kda: Kimi Delta Attention by chunks, Pallas TPU kernels forward and backward.

Recurrence (references/kda.py), per sequence and head, state S [K, V]:
    S' = diag(exp(g_t)) S_{t-1};  S_t = S' + (beta_t k_t)^T (v_t - k_t S');  o_t = scale q_t S_t
q and k are used as given (callers L2-normalise them, as FLA's chunk_kda expects by default).

Chunked form, per chunk with chunk-start state S and G = chunk-local cumsum of g:
    W, U  = (I + diag(beta) A_kk)^-1 (beta k exp(G)), (...)^-1 (beta v)   (intra kernel)
    v_new = U - W S;  o = scale ((q exp(G)) S + A_qk v_new)
    S_end = diag(exp(G_last)) S + (k exp(G_last - G))^T v_new            (recurrence kernel)
Backward (jax.custom_vjp): recompute the forward factors and states, run the state gradient
backwards over chunks, then every per-chunk gradient in parallel (kernels.py).
Grouped value heads (HV = G * H): the kernels run per value head h and read q, k head h // G
through their index maps; dq, dk are summed over each group here. GDN-2 (kernels_jax/gdn2)
splits beta into a per-K-channel erase gate b (beta k -> b k) and a per-V-channel write gate w
(beta v -> w v), `channel_gated_delta_rule`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels_jax.common.config import KernelConfig, prepare
from kernels_jax.common.layout import ChunkLayout

from . import kernels

ALIGN = 8  # head dims padded to whole sublanes


# ---------------------------------------------------------------- custom_vjp core
# gates: (beta [HV, P, 1],) for kda and gdn, (b [HV, P, K], w [HV, P, V]) for gdn2 (kernels.py)
def _forward(q, k, v, g, gates, h0, seq, first, last, cfg: KernelConfig, *, store_states: bool):
    """-> o, v_new, h (or None), ht, (W, A_qk)."""
    W, U, A_qk = kernels.intra(q, k, v, g, gates, cfg)
    outs = kernels.recurrence_fwd(
        q, k, g, W, U, A_qk, h0, (seq, first, last), cfg, out_dtype=q.dtype, store_states=store_states
    )
    o, vn, h, ht = outs if store_states else (outs[0], outs[1], None, outs[2])
    return o, vn, h, ht, (W, A_qk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9,))
def _kda_core(q, k, v, g, gates, h0, seq, first, last, cfg: KernelConfig):
    """Packed layout (kernels.py). -> o [HV, P, V] in q's dtype, ht [N, HV, K, V] float32."""
    o, _, _, ht, _ = _forward(q, k, v, g, gates, h0, seq, first, last, cfg, store_states=False)
    return o, ht


def _kda_core_fwd(q, k, v, g, gates, h0, seq, first, last, cfg):
    """Keeps the chunk factors W, A_qk, v_new and the chunk-start states h for the backward."""
    o, vn, h, ht, (W, A_qk) = _forward(q, k, v, g, gates, h0, seq, first, last, cfg, store_states=True)
    return (o, ht), (q, k, v, g, gates, (seq, first, last), W, A_qk, vn, h)


def _kda_core_bwd(cfg, residuals, cotangents):
    """From the forward's factors and chunk states: the state gradient backwards over chunks,
    then every per-chunk gradient. -> dq, dk, dv, dg, (dbeta,) or (db, dw), dh0."""
    q, k, v, g, gates, tables, W, A_qk, vn, h = residuals
    do, dht = cotangents
    dvn, dh, dh0 = kernels.recurrence_bwd(q, k, g, W, A_qk, do, dht.astype(jnp.float32), tables, cfg)
    dq, dk, dv, dg, *dgates = kernels.chunk_grads(q, k, v, g, gates, h, dh, vn, dvn, do, cfg)
    # per value head [HV, P, K] -> per q, k head [H, P, K]: the sum over its G value heads
    dq, dk = (x.reshape((cfg.H, cfg.G) + x.shape[1:]).sum(1) for x in (dq, dk))
    # g, the gates and h0 are float32 in the packed layout (chunk_kda casts them)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg, tuple(dgates), dh0, None, None, None


_kda_core.defvjp(_kda_core_fwd, _kda_core_bwd)


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
    o, ht = _chunk_delta_rule(q, k, v, g, (beta,), initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


def channel_gated_delta_rule(q, k, v, g, b, w, scale, initial_state, output_final_state, cu_seqlens, chunk_size):
    """GDN-2 by the KDA kernels: erase gate b [B, T, HV, K] on the keys, write gate w [B, T, HV, V]
    on the values (kernels_jax/gdn2). -> (o, final_state or None)."""
    layout, cfg = prepare(
        "gdn2",
        q,
        k,
        v,
        align=ALIGN,
        g=g,
        b=b,
        w=w,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    o, ht = _chunk_delta_rule(q, k, v, g, (b, w), initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(7,))
def _chunk_delta_rule(q, k, v, g, gates, initial_state, layout: ChunkLayout, cfg: KernelConfig):
    """The stages as one program: pack (K, V padded; g and the gates in float32), the kernels,
    unpack. gates: (beta [B, T, HV],) or (b [B, T, HV, K], w [B, T, HV, V])."""
    qp, kp, vp = layout.pack(q, cfg.K), layout.pack(k, cfg.K), layout.pack(v, cfg.V)
    gp = layout.pack(g.astype(jnp.float32), cfg.K)
    if len(gates) == 1:
        gates_p = (layout.pack(gates[0].astype(jnp.float32)[..., None]),)
    else:
        b, w = gates
        gates_p = (layout.pack(b.astype(jnp.float32), cfg.K), layout.pack(w.astype(jnp.float32), cfg.V))
    h0 = (
        jnp.zeros((cfg.N, cfg.HV, cfg.K, cfg.V), jnp.float32) if initial_state is None else cfg.pad_state(initial_state)
    )
    o, ht = _kda_core(qp, kp, vp, gp, gates_p, h0, *layout.tables(), cfg)
    return layout.unpack(o, cfg.V_in), cfg.cut_state(ht)
