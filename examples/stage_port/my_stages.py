"""A port of FLA's Simple GLA, half written: its first two forward stages, in plain jax.

Each function takes FLA 0.6.0's stage calling convention (fla.ops.common.chunk_h.chunk_fwd_h,
fla.ops.common.chunk_o.chunk_fwd_o): tensors [B, T, H, ...], gates after FLA's chunk-local cumsum
in log2 units (g [B, T, H]) or per head (g_gamma [H], log2 units), states [B, NT, H, K, V]. The
other stages are not written yet; packed sequences (cu_seqlens) are declined.
"""

import math

import jax
import jax.numpy as jnp

LN2 = math.log(2.0)


def _chunked(x, C):
    """[B, T, ...] -> [B, NT, C, ...], the last chunk padded by repeating the last token (so that
    a padded gate keeps the chunk's last real decay) and zeroed where it is padding."""
    B, T = x.shape[:2]
    NT = -(-T // C)
    pad = [(0, 0), (0, NT * C - T)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, pad, mode="edge").reshape(B, NT, C, *x.shape[2:])


def _log_decays(g, g_gamma, B, T, H, C):
    """b [B, NT, C, H] float32: the chunk-local cumulative log-decay in natural-log units."""
    if g is not None:
        return _chunked(g.astype(jnp.float32), C) * LN2
    steps = jnp.minimum(jnp.arange(-(-T // C) * C).reshape(-1, C) + 1, T)  # padding repeats the last token
    steps = steps - jnp.arange(0, steps.shape[0] * C, C)[:, None]
    return jnp.broadcast_to(steps[None, :, :, None] * g_gamma.astype(jnp.float32) * LN2, (B, *steps.shape, H))


def chunk_fwd_h(k, v, g=None, g_gamma=None, h0=None, output_final_state=False, cu_seqlens=None, chunk_size=64, **_):
    """h [B, NT, H, K, V] in k's dtype (the state before each chunk), ht [N, H, K, V] float32."""
    if cu_seqlens is not None:
        raise NotImplementedError("packed sequences (cu_seqlens) are not ported yet")
    B, T, H, K = k.shape
    V, C = v.shape[-1], chunk_size
    b = _log_decays(g, g_gamma, B, T, H, C)
    mask = (jnp.arange(-(-T // C) * C) < T).reshape(1, -1, C).astype(jnp.float32)  # 0 at padding
    kc = _chunked(k.astype(jnp.float32), C) * mask[..., None, None]
    vc = _chunked(v.astype(jnp.float32), C) * mask[..., None, None]
    state = jnp.zeros((B, H, K, V), jnp.float32) if h0 is None else h0.astype(jnp.float32)

    def step(S, chunk):
        kk, vv, bb = chunk  # [B, C, H, K], [B, C, H, V], [B, C, H]
        last = bb[:, -1]  # [B, H]
        S_next = jnp.exp(last)[..., None, None] * S + jnp.einsum(
            "bchk,bchv->bhkv", kk * jnp.exp(last[:, None] - bb)[..., None], vv, precision="highest"
        )
        return S_next, S

    ht, h = jax.lax.scan(step, state, (kc.swapaxes(0, 1), vc.swapaxes(0, 1), b.swapaxes(0, 1)))
    return h.swapaxes(0, 1).astype(k.dtype), (ht if output_final_state else None)


def chunk_fwd_o(q, k, v, h, g=None, g_gamma=None, scale=None, cu_seqlens=None, chunk_size=64, **_):
    """o [B, T, H, V] in v's dtype."""
    if cu_seqlens is not None:
        raise NotImplementedError("packed sequences (cu_seqlens) are not ported yet")
    B, T, H, K = q.shape
    C = chunk_size
    scale = K**-0.5 if scale is None else scale
    b = _log_decays(g, g_gamma, B, T, H, C)  # [B, NT, C, H]
    qc, kc, vc = (_chunked(x.astype(jnp.float32), C) for x in (q, k, v))
    causal = jnp.tril(jnp.ones((C, C), bool))
    decay = jnp.where(causal[None, None, :, :, None], jnp.exp(b[:, :, :, None] - b[:, :, None, :]), 0.0)
    scores = jnp.einsum("bnihk,bnjhk->bnijh", qc, kc, precision="highest") * decay
    o = jnp.einsum("bnijh,bnjhv->bnihv", scores, vc, precision="highest")
    o = o + jnp.exp(b)[..., None] * jnp.einsum("bnihk,bnhkv->bnihv", qc, h.astype(jnp.float32), precision="highest")
    return (scale * o).reshape(B, -1, H, v.shape[-1])[:, :T].astype(v.dtype)
