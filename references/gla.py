"""Float64 oracle for GLA with a per-channel gate (FLA's chunk_gla convention).

Per sequence, head h, with S_0 = initial_state (or 0), S_t in R^{K x V}:
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t        g_t = g[b, t, h, :]  (K log-decays)
    o_t = scale * q_t S_t                            scale defaults to K ** -0.5
Shapes: q, k, g [B, T, H, K]; v [B, T, H, V]; state [N, H, K, V].
`step` is the definition (run by references.common.run_recurrence, method="recurrence");
method="chunked" (the default) computes the same in chunks (references.chunked.gla_chunked).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from references.chunked import gla_chunked
from references.common import check_method, run_recurrence, validate


def step(S, q, k, v, g, scale):
    """One token. S [B, H, K, V]; q, k, g [B, H, K]; v [B, H, V]; scale [B, H]."""
    S = jnp.exp(g)[..., None] * S + k[..., :, None] * v[..., None, :]
    return S, scale[..., None] * jnp.einsum("bhk,bhkv->bhv", q, S)


def _prepare(q, k, v, g, scale, initial_state, cu_seqlens):
    """-> (dims, per-token inputs of `step` [B, T, H, ...], scale as a number)."""
    if g is None:
        raise ValueError("g [B, T, H, K] is required")
    dims = validate(q, k, v, gates={"g": (g, np.shape(q))}, initial_state=initial_state, cu_seqlens=cu_seqlens)
    B, T, H, K = dims[:4]
    scale = K**-0.5 if scale is None else scale
    return dims, {"q": q, "k": k, "v": v, "g": g, "scale": np.full((B, T, H), scale)}, scale


def _run(tok, scale, initial_state, cu_seqlens, dims, method, cotangents=None):
    """(o, ht) or (o, ht, grads keyed q, k, v, g, initial_state) by `method`."""
    if check_method(method) == "recurrence":
        return run_recurrence(step, tok, initial_state, cu_seqlens, dims, cotangents=cotangents)
    do, dht = cotangents or (None, None)
    return gla_chunked(tok["q"], tok["k"], tok["v"], tok["g"], scale, initial_state, cu_seqlens, do=do, dht=dht)


def forward(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, method="chunked"):
    """Returns (o [B, T, H, V], final_state [N, H, K, V] or None), float64 numpy."""
    dims, tok, scale = _prepare(q, k, v, g, scale, initial_state, cu_seqlens)
    o, ht = _run(tok, scale, initial_state, cu_seqlens, dims, method)
    return o, (ht if output_final_state else None)


def forward_backward(q, k, v, g, scale=None, initial_state=None, cu_seqlens=None, *, do, dht=None, method="chunked"):
    """Returns dict o, ht, dq, dk, dv, dg, dh0 (float64 numpy); dht None means 0."""
    dims, tok, scale = _prepare(q, k, v, g, scale, initial_state, cu_seqlens)
    o, ht, gr = _run(tok, scale, initial_state, cu_seqlens, dims, method, cotangents=(do, dht))
    return {"o": o, "ht": ht, "dq": gr["q"], "dk": gr["k"], "dv": gr["v"], "dg": gr["g"], "dh0": gr["initial_state"]}
