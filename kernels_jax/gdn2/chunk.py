"""chunk_gdn2: GDN-2 (Gated DeltaNet-2) by chunks, forward and backward, Pallas TPU kernels.

Recurrence (FLA's fla/ops/gdn2/naive.py), per sequence and value head, state S [K, V]:
    S_t = (I - k_t (b_t * k_t)^T) Diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T;  o_t = scale q_t S_t
with g [B, T, HV, K] the per-channel log-decay, b [B, T, HV, K] the erase gate (on the key
channels) and w [B, T, HV, V] the write gate (on the value channels); b = beta 1_K, w = beta 1_V
is KDA. Chunked in KDA's WY form with beta k become b k and beta v become w v, per chunk with
chunk-start state S and G = chunk-local cumsum of g:
    A_kk[i, j] = sum_c b_i[c] k_i[c] k_j[c] exp(G_i[c] - G_j[c])  (j < i),  Inv = (I + A_kk)^-1
    W = Inv (b k exp(G)),  U = Inv (w v)                                   (intra kernel)
    v_new = U - W S;  o = scale ((q exp(G)) S + A_qk v_new)
    S_end = diag(exp(G_last)) S + (k exp(G_last - G))^T v_new               (recurrence kernel)
Backward (jax.custom_vjp): the state gradient backwards over chunks, then every per-chunk
gradient in parallel (kernels.py); db per K channel, dw per V channel. Grouped value heads
(HV = G * H): the kernels run per value head h and read q, k head h // G through their index
maps; dq, dk are summed over each group here.
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
# packed layout: q, k [H, P, K]; v [HV, P, V]; g, b [HV, P, K], w [HV, P, V] float32 (kernels.py)
def _forward(q, k, v, g, b, w, h0, seq, first, last, cfg: KernelConfig, *, store_states: bool):
    """-> o, v_new, h (or None), ht, (W, A_qk)."""
    W, U, A_qk = kernels.intra(q, k, v, g, b, w, cfg)
    outs = kernels.recurrence_fwd(
        q, k, g, W, U, A_qk, h0, (seq, first, last), cfg, out_dtype=q.dtype, store_states=store_states
    )
    o, vn, h, ht = outs if store_states else (outs[0], outs[1], None, outs[2])
    return o, vn, h, ht, (W, A_qk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(10,))
def _gdn2_core(q, k, v, g, b, w, h0, seq, first, last, cfg: KernelConfig):
    """Packed layout (kernels.py). -> o [HV, P, V] in q's dtype, ht [N, HV, K, V] float32."""
    o, _, _, ht, _ = _forward(q, k, v, g, b, w, h0, seq, first, last, cfg, store_states=False)
    return o, ht


def _gdn2_core_fwd(q, k, v, g, b, w, h0, seq, first, last, cfg):
    """Keeps the chunk factors W, A_qk, v_new and the chunk-start states h for the backward."""
    o, vn, h, ht, (W, A_qk) = _forward(q, k, v, g, b, w, h0, seq, first, last, cfg, store_states=True)
    return (o, ht), (q, k, v, g, b, w, (seq, first, last), W, A_qk, vn, h)


def _gdn2_core_bwd(cfg, residuals, cotangents):
    """From the forward's factors and chunk states: the state gradient backwards over chunks,
    then every per-chunk gradient. -> dq, dk, dv, dg, db, dw, dh0."""
    q, k, v, g, b, w, tables, W, A_qk, vn, h = residuals
    do, dht = cotangents
    dvn, dh, dh0 = kernels.recurrence_bwd(q, k, g, W, A_qk, do, dht.astype(jnp.float32), tables, cfg)
    dq, dk, dv, dg, db, dw = kernels.chunk_grads(q, k, v, g, b, w, h, dh, vn, dvn, do, cfg)
    dq, dk = cfg.sum_groups(dq), cfg.sum_groups(dk)  # per value head -> per q, k head
    # g, the gates and h0 are float32 in the packed layout (chunk_gdn2 casts them)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg, db, dw, dh0, None, None, None


_gdn2_core.defvjp(_gdn2_core_fwd, _gdn2_core_bwd)


# ---------------------------------------------------------------- public entry point
def chunk_gdn2(
    q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """GDN-2, chunked (FLA's chunk_gdn2 convention).

    q, k [B, T, H, K] (L2-normalised by the caller), v [B, T, HV, V] (HV = G * H: value head j
    reads q, k head j // G); g [B, T, HV, K] per-channel log-decay; b [B, T, HV, K] erase gate;
    w [B, T, HV, V] write gate; initial_state [N, HV, K, V] float32 (N = B, or the number of
    packed sequences with cu_seqlens [N + 1] and B == 1). Returns (o [B, T, HV, V] in q's dtype,
    final_state [N, HV, K, V] float32 or None).
    """
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
    o, ht = _chunk_gdn2_jit(q, k, v, g, b, w, initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(8,))
def _chunk_gdn2_jit(q, k, v, g, b, w, initial_state, layout: ChunkLayout, cfg: KernelConfig):
    """The kernels as one program: pack (K, V padded; g and the gates in float32), the kernels,
    unpack."""
    f32 = lambda x, width: layout.pack(x.astype(jnp.float32), width)  # noqa: E731
    h0 = (
        jnp.zeros((cfg.N, cfg.HV, cfg.K, cfg.V), jnp.float32) if initial_state is None else cfg.pad_state(initial_state)
    )
    o, ht = _gdn2_core(
        layout.pack(q, cfg.K),
        layout.pack(k, cfg.K),
        layout.pack(v, cfg.V),
        f32(g, cfg.K),
        f32(b, cfg.K),
        f32(w, cfg.V),
        h0,
        *layout.tables(),
        cfg,
    )
    return layout.unpack(o, cfg.V_in), cfg.cut_state(ht)
