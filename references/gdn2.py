"""Float64 oracle for GDN-2, Gated DeltaNet 2 (FLA's naive_recurrent_gdn2 convention).

Per sequence, value head j, with S_0 = initial_state (or 0), S_t in R^{K x V}:
    S'  = diag(exp(g_t)) S_{t-1}                         g_t = g[b, t, j, :] (K log-decays)
    S_t = S' + k_t^T (w_t * v_t - (b_t * k_t) S')        b_t = b[b, t, j, :] [K], w_t = w[b, t, j, :] [V]
    o_t = scale * q_t S_t                                 scale defaults to K ** -0.5
i.e. S_t = (I - k_t (b_t * k_t)^T) Diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T: the gated delta rule
with a channel-wise erase gate b on the key axis and write gate w on the value axis. With
b = beta 1_K and w = beta 1_V it is KDA (references/kda.py). q and k are used as given (the
harness passes them L2-normalised). Grouped value heads (FLA's GVA): HV = G * H value heads,
value head j reads q, k head j // G.
Shapes: q, k [B, T, H, K]; g, b [B, T, HV, K]; v, w [B, T, HV, V]; state [N, HV, K, V].
`step` is the definition (run by references.common.run_recurrence, method="recurrence");
method="chunked" (the default) computes the same in chunks (references.chunked.gdn2_chunked).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from references.chunked import gdn2_chunked
from references.common import check_method, run_recurrence, validate


def step(S, q, k, v, g, b, w, scale):
    """One token. S [B, HV, K, V]; q, k [B, H, K]; g, b [B, HV, K]; v, w [B, HV, V]; scale [B, HV].
    Value head h * G + i (HV = G * H) reads q, k head h: the state is grouped [B, H, G, K, V]."""
    B, HV, K, V = S.shape
    H = q.shape[1]
    grp = lambda x: x.reshape((B, H, HV // H) + x.shape[2:])  # noqa: E731
    S, g, v, b, w, scale = grp(S), grp(g), grp(v), grp(b), grp(w), grp(scale)
    S = jnp.exp(g)[..., None] * S
    erase = jnp.einsum("bhgk,bhgkv->bhgv", b * k[:, :, None, :], S)
    S = S + k[:, :, None, :, None] * (w * v - erase)[..., None, :]
    o = scale[..., None] * jnp.einsum("bhk,bhgkv->bhgv", q, S)
    return S.reshape(B, HV, K, V), o.reshape(B, HV, V)


def _prepare(q, k, v, g, b, w, scale, initial_state, cu_seqlens):
    """-> (dims, per-token inputs of `step` [B, T, H or HV, ...], scale as a number)."""
    if g is None or b is None or w is None:
        raise ValueError("g [B, T, HV, K], b [B, T, HV, K] and w [B, T, HV, V] are required")
    B, T, _, K = np.shape(q)
    HV, V = (np.shape(v)[2], np.shape(v)[3]) if np.ndim(v) == 4 else (None, None)
    dims = validate(
        q,
        k,
        v,
        gates={"g": (g, (B, T, HV, K)), "b": (b, (B, T, HV, K)), "w": (w, (B, T, HV, V))},
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        grouped=True,
    )
    scale = dims[3] ** -0.5 if scale is None else scale
    tok = {"q": q, "k": k, "v": v, "g": g, "b": b, "w": w, "scale": np.full((B, T, HV), scale)}
    return dims, tok, scale


def _run(tok, scale, initial_state, cu_seqlens, dims, method, cotangents=None):
    """(o, ht) or (o, ht, grads keyed q, k, v, g, b, w, initial_state) by `method`."""
    if check_method(method) == "recurrence":
        return run_recurrence(step, tok, initial_state, cu_seqlens, dims, cotangents=cotangents)
    do, dht = cotangents or (None, None)
    x = [tok[n] for n in ("q", "k", "v", "g", "b", "w")]
    return gdn2_chunked(*x, scale, initial_state, cu_seqlens, do=do, dht=dht)


def forward(
    q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, method="chunked"
):
    """Returns (o [B, T, HV, V], final_state [N, HV, K, V] or None), float64 numpy."""
    dims, tok, scale = _prepare(q, k, v, g, b, w, scale, initial_state, cu_seqlens)
    o, ht = _run(tok, scale, initial_state, cu_seqlens, dims, method)
    return o, (ht if output_final_state else None)


def forward_backward(
    q, k, v, g, b, w, scale=None, initial_state=None, cu_seqlens=None, *, do, dht=None, method="chunked"
):
    """Returns dict o, ht, dq, dk, dv, dg, db, dw, dh0 (float64 numpy); dht None means 0."""
    dims, tok, scale = _prepare(q, k, v, g, b, w, scale, initial_state, cu_seqlens)
    o, ht, gr = _run(tok, scale, initial_state, cu_seqlens, dims, method, (do, dht))
    names = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "db": "b", "dw": "w", "dh0": "initial_state"}
    return {"o": o, "ht": ht} | {out: gr[n] for out, n in names.items()}
