"""Float64 oracle for KDA, Kimi Delta Attention (FLA's naive_recurrent_kda convention).

Per sequence, head h, with S_0 = initial_state (or 0), S_t in R^{K x V}:
    S'  = diag(exp(g_t)) S_{t-1}                         g_t = g[b, t, h, :] (K log-decays)
    S_t = S' + (beta_t k_t)^T (v_t - k_t S')             beta_t = beta[b, t, h] (scalar)
    o_t = scale * q_t S_t                                 scale defaults to K ** -0.5
i.e. the gated delta rule: decay per channel, then one delta-rule correction of the
prediction k_t S' towards v_t with learning rate beta_t. q and k are used as given (the
harness passes them L2-normalised, as FLA's tests do).
Shapes: q, k, g [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; state [N, H, K, V].
`step` is the definition (run by references.common.run_recurrence, method="recurrence");
method="chunked" (the default) computes the same in chunks (references.chunked.kda_chunked).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from references.chunked import kda_chunked
from references.common import check_method, run_recurrence, validate


def step(S, q, k, v, g, beta, scale):
    """One token. S [B, H, K, V]; q, k, g [B, H, K]; v [B, H, V]; beta, scale [B, H]."""
    S = jnp.exp(g)[..., None] * S
    err = v - jnp.einsum("bhk,bhkv->bhv", k, S)
    S = S + (beta[..., None] * k)[..., :, None] * err[..., None, :]
    return S, scale[..., None] * jnp.einsum("bhk,bhkv->bhv", q, S)


def _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens):
    """-> (dims, per-token inputs of `step` [B, T, H, ...], scale as a number)."""
    if g is None or beta is None:
        raise ValueError("g [B, T, H, K] and beta [B, T, H] are required")
    B, T, H = np.shape(q)[:3]
    dims = validate(
        q,
        k,
        v,
        gates={"g": (g, np.shape(q)), "beta": (beta, (B, T, H))},
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    scale = dims[3] ** -0.5 if scale is None else scale
    return dims, {"q": q, "k": k, "v": v, "g": g, "beta": beta, "scale": np.full((B, T, H), scale)}, scale


def _run(tok, scale, initial_state, cu_seqlens, dims, method, cotangents=None):
    """(o, ht) or (o, ht, grads keyed q, k, v, g, beta, initial_state) by `method`."""
    if check_method(method) == "recurrence":
        return run_recurrence(step, tok, initial_state, cu_seqlens, dims, cotangents=cotangents)
    do, dht = cotangents or (None, None)
    x = [tok[n] for n in ("q", "k", "v", "g", "beta")]
    return kda_chunked(*x, scale, initial_state, cu_seqlens, do=do, dht=dht)


def forward(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, method="chunked"
):
    """Returns (o [B, T, H, V], final_state [N, H, K, V] or None), float64 numpy."""
    dims, tok, scale = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    o, ht = _run(tok, scale, initial_state, cu_seqlens, dims, method)
    return o, (ht if output_final_state else None)


def forward_backward(
    q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, *, do, dht=None, method="chunked"
):
    """Returns dict o, ht, dq, dk, dv, dg, dbeta, dh0 (float64 numpy); dht None means 0."""
    dims, tok, scale = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    o, ht, gr = _run(tok, scale, initial_state, cu_seqlens, dims, method, cotangents=(do, dht))
    return {
        "o": o,
        "ht": ht,
        "dq": gr["q"],
        "dk": gr["k"],
        "dv": gr["v"],
        "dg": gr["g"],
        "dbeta": gr["beta"],
        "dh0": gr["initial_state"],
    }
