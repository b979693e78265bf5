"""Float64 oracle for KDA, Kimi Delta Attention (FLA's naive_recurrent_kda convention).

Per sequence, value head j, with S_0 = initial_state (or 0), S_t in R^{K x V}:
    S'  = diag(exp(g_t)) S_{t-1}                         g_t = g[b, t, j, :] (K log-decays)
    S_t = S' + (beta_t k_t)^T (v_t - k_t S')             beta_t = beta[b, t, j] (scalar)
    o_t = scale * q_t S_t                                 scale defaults to K ** -0.5
i.e. the gated delta rule: decay per channel, then one delta-rule correction of the
prediction k_t S' towards v_t with learning rate beta_t. q and k are used as given (the
harness passes them L2-normalised, as FLA's tests do). Grouped value heads (FLA's GVA):
HV = G * H value heads, value head j reads q, k head j // G (q_t, k_t above are those).
Shapes: q, k [B, T, H, K]; g [B, T, HV, K]; v [B, T, HV, V]; beta [B, T, HV]; state [N, HV, K, V].
`step` is the definition (run by references.common.run_recurrence, method="recurrence");
method="chunked" (the default) computes the same in chunks (references.chunked.kda_chunked).
GDN (references/gdn.py) is this op with one log-decay per head, broadcast over K.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from references.chunked import kda_chunked
from references.common import check_method, run_recurrence, validate


def step(S, q, k, v, g, beta, scale):
    """One token. S [B, HV, K, V]; q, k [B, H, K]; g [B, HV, K]; v [B, HV, V]; beta, scale [B, HV].
    Value head h * G + i (HV = G * H) reads q, k head h: the state is grouped [B, H, G, K, V]."""
    B, HV, K, V = S.shape
    H = q.shape[1]
    grp = lambda x: x.reshape((B, H, HV // H) + x.shape[2:])  # noqa: E731
    S, g, v, beta, scale = grp(S), grp(g), grp(v), grp(beta), grp(scale)
    S = jnp.exp(g)[..., None] * S
    err = v - jnp.einsum("bhk,bhgkv->bhgv", k, S)
    S = S + (beta[..., None, None] * k[:, :, None, :, None]) * err[..., None, :]
    o = scale[..., None] * jnp.einsum("bhk,bhgkv->bhgv", q, S)
    return S.reshape(B, HV, K, V), o.reshape(B, HV, V)


def _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens, per_head: bool):
    """-> (dims, per-token inputs of `step` [B, T, H or HV, ...], scale as a number).
    per_head: g [B, T, HV] (gdn), else [B, T, HV, K] (kda)."""
    gate = "[B, T, HV]" if per_head else "[B, T, HV, K]"
    if g is None or beta is None:
        raise ValueError(f"g {gate} and beta [B, T, HV] are required")
    B, T, _, K = np.shape(q)
    HV = np.shape(v)[2] if np.ndim(v) == 4 else None
    g_shape = (B, T, HV) if per_head else (B, T, HV, K)
    dims = validate(
        q,
        k,
        v,
        gates={"g": (g, g_shape), "beta": (beta, (B, T, HV))},
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        grouped=True,
    )
    scale = dims[3] ** -0.5 if scale is None else scale
    return dims, {"q": q, "k": k, "v": v, "g": g, "beta": beta, "scale": np.full((B, T, HV), scale)}, scale


def _run(step_fn, tok, scale, initial_state, cu_seqlens, dims, method, per_head, cotangents=None):
    """(o, ht) or (o, ht, grads keyed q, k, v, g, beta, initial_state) by `method`."""
    if check_method(method) == "recurrence":
        return run_recurrence(step_fn, tok, initial_state, cu_seqlens, dims, cotangents=cotangents)
    do, dht = cotangents or (None, None)
    g = np.asarray(tok["g"])[..., None] if per_head else tok["g"]  # one log-decay per head: [B, T, HV, 1]
    x = [tok["q"], tok["k"], tok["v"], g, tok["beta"]]
    out = kda_chunked(*x, scale, initial_state, cu_seqlens, do=do, dht=dht)
    if cotangents is not None and per_head:
        out[2]["g"] = out[2]["g"][..., 0]
    return out


def delta_rule(step_fn, per_head: bool):
    """(forward, forward_backward) of the gated delta rule defined by `step_fn`, with a
    per-channel (kda) or per-head (gdn) log-decay g."""

    def forward(
        q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, method="chunked"
    ):
        """Returns (o [B, T, HV, V], final_state [N, HV, K, V] or None), float64 numpy."""
        dims, tok, scale = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens, per_head)
        o, ht = _run(step_fn, tok, scale, initial_state, cu_seqlens, dims, method, per_head)
        return o, (ht if output_final_state else None)

    def forward_backward(
        q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, *, do, dht=None, method="chunked"
    ):
        """Returns dict o, ht, dq, dk, dv, dg, dbeta, dh0 (float64 numpy); dht None means 0."""
        dims, tok, scale = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens, per_head)
        o, ht, gr = _run(step_fn, tok, scale, initial_state, cu_seqlens, dims, method, per_head, (do, dht))
        names = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "dh0": "initial_state"}
        return {"o": o, "ht": ht} | {out: gr[n] for out, n in names.items()}

    return forward, forward_backward


forward, forward_backward = delta_rule(step, per_head=False)
