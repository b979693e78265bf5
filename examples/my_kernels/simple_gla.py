"""Simple GLA in plain JAX, chunked as a TPU kernel would be; gradients by jax's autodiff.

FLA's calling convention (the harness calls candidates this way; parity/execute/backends/calling.py):

    chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                     output_final_state=False, cu_seqlens=None, chunk_size=64) -> (o, final_state)

q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] (log decay per token) or g_gamma [H] (per head);
initial_state and final_state [B, H, K, V] in float32; o [B, T, H, V] in v's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def chunked_simple_gla(
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
    precision=jax.lax.Precision.HIGHEST,
):
    """The chunked algorithm with its float32 einsums at `precision`: HIGHEST is six bf16 MXU
    passes on a TPU (float32-accurate), DEFAULT one pass on bf16-rounded operands."""
    if cu_seqlens is not None:
        raise NotImplementedError("varlen (cu_seqlens) is not implemented by this kernel")
    B, T, H, K = q.shape
    V, C = v.shape[-1], chunk_size
    scale = K**-0.5 if scale is None else scale
    NT = -(-T // C)
    pad = lambda x: jnp.pad(x.astype(jnp.float32), [(0, 0), (0, NT * C - T)] + [(0, 0)] * (x.ndim - 2))
    g = jnp.broadcast_to(g_gamma, (B, T, H)) if g_gamma is not None else g
    qc, kc, vc, gc = (pad(x).reshape(B, NT, C, H, -1) for x in (q, k, v, g[..., None]))
    b = jnp.cumsum(gc[..., 0], axis=2)  # [B, NT, C, H] decay from the chunk's start
    mask = jnp.tril(jnp.ones((C, C), bool))[None, :, :, None]
    decay = jnp.exp(jnp.where(mask, b[:, :, :, None] - b[:, :, None], -jnp.inf))  # [B, NT, C, C, H]
    ein = lambda spec, *xs: jnp.einsum(spec, *xs, precision=precision)

    def step(state, c):  # state [B, H, K, V]
        qi, ki, vi, bi, di = qc[:, c], kc[:, c], vc[:, c], b[:, c], decay[:, c]
        att = ein("bihk,bjhk->bijh", qi, ki) * di
        o = ein("bijh,bjhv->bihv", att, vi) + ein("bihk,bhkv->bihv", qi * jnp.exp(bi)[..., None], state)
        last = bi[:, -1]  # [B, H]
        kd = ki * jnp.exp(last[:, None] - bi)[..., None]
        state = state * jnp.exp(last)[..., None, None] + ein("bjhk,bjhv->bhkv", kd, vi)
        return state, o * scale

    h0 = jnp.zeros((B, H, K, V), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    ht, o = jax.lax.scan(step, h0, jnp.arange(NT))
    o = jnp.moveaxis(o, 0, 1).reshape(B, NT * C, H, V)[:, :T]
    return o.astype(v.dtype), (ht if output_final_state else None)


def chunk_simple_gla(
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
    """The kernel under test: the chunked algorithm at HIGHEST precision."""
    return chunked_simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens, chunk_size)
