"""Example candidates in FLA's calling convention, for trying the harness and testing it.

    parity run --suite smoke --backends oracle --candidate scan=jax:parity.examples:recurrent_scan

`recurrent_scan` is the oracle's own recurrence (references/) run by jax in float32: a
correct, slow candidate. `raises`, `returns_nan` and `never_returns` are deliberately
broken, to show that a failing candidate is recorded without stopping a run.
`chunked_jax_default` / `chunked_jax_highest`: a plain-JAX chunked Simple GLA whose float32
einsums are DEFAULT (one bf16 MXU pass on a TPU) or HIGHEST: under the TPU numerics model
(parity.tpu_numerics) the first is less accurate than FLA on a GPU, the second is not.
"""
from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np

from references import gla as _gla
from references import kda as _kda
from references import simple_gla as _sgla
from references.common import _scan, _segments


def recurrent_scan(q, k, v, g=None, g_gamma=None, beta=None, scale=None, initial_state=None,
                   output_final_state=False, cu_seqlens=None):
    """Any op by its per-token recurrence in float32: simple_gla when g is [B, T, H] or
    g_gamma is given, kda when beta is given, gla otherwise. Returns (o, final_state)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    cu = None if cu_seqlens is None else np.asarray(cu_seqlens)
    seg, start, end, N = _segments(T, B, cu)
    scale = K ** -0.5 if scale is None else scale
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    tok = {"q": f32(q), "k": f32(k), "v": f32(v), "scale": jnp.full((B, T, H), scale, jnp.float32)}
    if g_gamma is not None:
        tok["g"] = jnp.broadcast_to(f32(g_gamma), (B, T, H))
        step = _sgla.step
    else:
        tok["g"] = f32(g)
        step = _sgla.step if g.ndim == 3 else _kda.step if beta is not None else _gla.step
    if beta is not None:
        tok["beta"] = f32(beta)
    h0 = jnp.zeros((N, H, K, V), jnp.float32) if initial_state is None else f32(initial_state)
    xs = {n: jnp.moveaxis(a, 1, 0) for n, a in tok.items()}
    o, ht = _scan(step, xs, h0, seg, start, end, varlen=cu is not None, N=N)
    return jnp.moveaxis(o, 0, 1).astype(v.dtype), (ht if output_final_state else None)


def raises(q, k, v, *args, **kwargs):
    """A candidate that fails with an exception."""
    raise RuntimeError("example candidate: deliberate failure")


def returns_nan(q, k, v, *args, **kwargs):
    """A candidate whose outputs are all NaN."""
    kwargs.pop("chunk_size", None)
    o, ht = recurrent_scan(q, k, v, *args, **kwargs)
    return o * jnp.nan, (None if ht is None else ht * jnp.nan)


def never_returns(q, k, v, *args, **kwargs):
    """A candidate that hangs (the runner's timeout must kill it)."""
    while True:
        time.sleep(1)


def _chunked_einsum_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, cu_seqlens=None, chunk_size=64, precision=None):
    """Simple GLA in plain JAX, chunked as a TPU kernel would be, its float32 einsums at
    `precision` (no varlen). q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] or g_gamma [H]."""
    import jax
    if cu_seqlens is not None:
        raise NotImplementedError("no varlen in this example")
    B, T, H, K = q.shape
    V, C = v.shape[-1], chunk_size
    scale = K ** -0.5 if scale is None else scale
    NT = -(-T // C)
    pad = lambda x: jnp.pad(x.astype(jnp.float32), [(0, 0), (0, NT * C - T)] + [(0, 0)] * (x.ndim - 2))
    g = jnp.broadcast_to(g_gamma, (B, T, H)) if g_gamma is not None else g
    qc, kc, vc, gc = (pad(x).reshape(B, NT, C, H, -1) for x in (q, k, v, g[..., None]))
    b = jnp.cumsum(gc[..., 0], axis=2)                                    # [B, NT, C, H]
    mask = jnp.tril(jnp.ones((C, C), bool))[None, :, :, None]
    decay = jnp.exp(jnp.where(mask, b[:, :, :, None] - b[:, :, None], -jnp.inf))  # [B, NT, C, C, H]
    ein = lambda spec, *xs: jnp.einsum(spec, *xs, precision=precision)

    def step(state, c):                                                   # state [B, H, K, V]
        qi, ki, vi, bi, di = qc[:, c], kc[:, c], vc[:, c], b[:, c], decay[:, c]
        att = ein("bihk,bjhk->bijh", qi, ki) * di
        o = ein("bijh,bjhv->bihv", att, vi) + ein("bihk,bhkv->bihv", qi * jnp.exp(bi)[..., None], state)
        last = bi[:, -1]                                                  # [B, H]
        kd = ki * jnp.exp(last[:, None] - bi)[..., None]
        state = state * jnp.exp(last)[..., None, None] + ein("bjhk,bjhv->bhkv", kd, vi)
        return state, o * scale

    h0 = jnp.zeros((B, H, K, V), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    ht, o = jax.lax.scan(step, h0, jnp.arange(NT))
    o = jnp.moveaxis(o, 0, 1).reshape(B, NT * C, H, V)[:, :T]
    return o.astype(v.dtype), (ht if output_final_state else None)


def chunked_jax_default(q, k, v, **kw):
    """Plain-JAX chunked Simple GLA with DEFAULT-precision float32 einsums: one bf16 MXU pass
    on a TPU (less accurate than FLA's TF32 on a GPU), float32 on XLA:CPU."""
    return _chunked_einsum_simple_gla(q, k, v, **kw, precision=None)


def chunked_jax_highest(q, k, v, **kw):
    """The same at HIGHEST (six bf16 passes on a TPU): its accurate twin."""
    import jax
    return _chunked_einsum_simple_gla(q, k, v, **kw, precision=jax.lax.Precision.HIGHEST)
