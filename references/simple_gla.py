"""Float64 oracle for Simple GLA (FLA's chunk_simple_gla convention).

Per sequence, head h, with S_0 = initial_state (or 0), S_t in R^{K x V}:
    S_t = exp(g_t) * S_{t-1} + k_t^T v_t          g_t = g[b, t, h]  or  g_gamma[h]
    o_t = scale * q_t S_t                          scale defaults to K ** -0.5
Shapes: q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H]; g_gamma [H]; state [N, H, K, V].
`step` is the definition (run by references.common.run_recurrence, method="recurrence");
method="chunked" (the default) computes the same in chunks (references.chunked.gla_chunked).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from references.chunked import gla_chunked
from references.common import check_method, run_recurrence, validate


def step(S, q, k, v, g, scale):
    """One token. S [B, H, K, V]; q, k [B, H, K]; v [B, H, V]; g [B, H]; scale [B, H]."""
    S = jnp.exp(g)[..., None, None] * S + k[..., :, None] * v[..., None, :]
    return S, scale[..., None] * jnp.einsum("bhk,bhkv->bhv", q, S)


def _prepare(q, k, v, g, g_gamma, scale, initial_state, cu_seqlens):
    """-> (dims, per-token inputs of `step` [B, T, H, ...], scale as a number)."""
    if g is not None and g_gamma is not None:
        raise ValueError("give g or g_gamma, not both")
    if g is None and g_gamma is None:
        raise ValueError("one of g [B, T, H] or g_gamma [H] is required")
    B, T, H = np.shape(q)[:3]
    dims = validate(
        q,
        k,
        v,
        gates={"g": (g, (B, T, H)), "g_gamma": (g_gamma, (H,))},
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    scale = dims[3] ** -0.5 if scale is None else scale
    # g_gamma [H] is the per-token gate g_t = g_gamma for every token: dg_gamma = sum over tokens of dg
    g = np.broadcast_to(np.asarray(g_gamma), (B, T, H)) if g is None else g
    return dims, {"q": q, "k": k, "v": v, "g": g, "scale": np.full((B, T, H), scale)}, scale


def _run(tok, scale, initial_state, cu_seqlens, dims, method, cotangents=None):
    """(o, ht) or (o, ht, grads keyed q, k, v, g, initial_state) by `method`."""
    if check_method(method) == "recurrence":
        return run_recurrence(step, tok, initial_state, cu_seqlens, dims, cotangents=cotangents)
    g = np.asarray(tok["g"])[..., None]  # one log-decay per head: [B, T, H, 1]
    do, dht = cotangents or (None, None)
    out = gla_chunked(tok["q"], tok["k"], tok["v"], g, scale, initial_state, cu_seqlens, do=do, dht=dht)
    if cotangents is not None:
        out[2]["g"] = out[2]["g"][..., 0]
    return out


def forward(
    q,
    k,
    v,
    g=None,
    g_gamma=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    method="chunked",
):
    """Returns (o [B, T, H, V], final_state [N, H, K, V] or None), float64 numpy."""
    dims, tok, scale = _prepare(q, k, v, g, g_gamma, scale, initial_state, cu_seqlens)
    o, ht = _run(tok, scale, initial_state, cu_seqlens, dims, method)
    return o, (ht if output_final_state else None)


def forward_backward(
    q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, cu_seqlens=None, *, do, dht=None, method="chunked"
):
    """Returns dict o, ht, dq, dk, dv, dg or dg_gamma, dh0 (float64 numpy); dht None means 0.
    With g_gamma also dg_gamma_terms [B, T, H]: the per-token terms dg_gamma sums (the gradient of
    each token's g_t = g_gamma), from which the comparator reads how much that sum cancels."""
    dims, tok, scale = _prepare(q, k, v, g, g_gamma, scale, initial_state, cu_seqlens)
    o, ht, gr = _run(tok, scale, initial_state, cu_seqlens, dims, method, cotangents=(do, dht))
    out = {"o": o, "ht": ht, "dq": gr["q"], "dk": gr["k"], "dv": gr["v"], "dh0": gr["initial_state"]}
    if g is not None:
        out["dg"] = gr["g"]
    else:
        out["dg_gamma"], out["dg_gamma_terms"] = gr["g"].sum(axis=(0, 1)), gr["g"]
    return out
