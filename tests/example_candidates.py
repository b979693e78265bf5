"""Test fixtures: candidates in FLA's calling convention (run from the checkout's root, where
`tests` is importable by the module path of a --candidate spec).

    parity run --suite smoke --backends oracle --candidate scan=jax:tests.example_candidates:recurrent_scan

`recurrent_scan` is the oracle's own recurrence (references/) run by jax in float32: a
correct, slow candidate. `raises`, `returns_nan` and `never_returns` are deliberately
broken, to show that a failing candidate is recorded without stopping a run.
`chunked_jax_default` / `chunked_jax_highest`: the example repository's plain-JAX chunked
Simple GLA (examples/my_kernels) with its float32 einsums DEFAULT (one bf16 MXU pass on a
TPU) or HIGHEST: under the TPU numerics model (parity.measure.tpu_numerics) the first is less
accurate than FLA on a GPU, the second is not.
`cut_gradients` is recurrent_scan with every input's gradient cut (right forward, zero
backward); `forward_only_scan` is the same declared forward-only (`forward_only = True`).
"""

from __future__ import annotations

import inspect
import time

import jax
import jax.numpy as jnp
import numpy as np

from examples.my_kernels.simple_gla import chunked_simple_gla
from references import gla as _gla
from references import kda as _kda
from references import simple_gla as _sgla
from references.common import _scan, _segments


def recurrent_scan(
    q, k, v, g=None, g_gamma=None, beta=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Any op by its per-token recurrence in float32: simple_gla when g is [B, T, H] or
    g_gamma is given, kda when beta is given, gla otherwise. Returns (o, final_state)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    cu = None if cu_seqlens is None else np.asarray(cu_seqlens)
    seg, start, end, N = _segments(T, B, cu)
    scale = K**-0.5 if scale is None else scale
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


def chunked_jax_default(q, k, v, **kw):
    """Plain-JAX chunked Simple GLA with DEFAULT-precision float32 einsums: one bf16 MXU pass
    on a TPU (less accurate than FLA's TF32 on a GPU), float32 on XLA:CPU."""
    return chunked_simple_gla(q, k, v, **kw, precision=None)


def chunked_jax_highest(q, k, v, **kw):
    """The same at HIGHEST (six bf16 passes on a TPU): its accurate twin."""
    return chunked_simple_gla(q, k, v, **kw, precision=jax.lax.Precision.HIGHEST)


def cut_gradients(
    q, k, v, g=None, g_gamma=None, beta=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """recurrent_scan on stop_gradient'ed inputs: the forward right, every gradient zero."""
    cut = lambda x: None if x is None else jax.lax.stop_gradient(x)
    return recurrent_scan(
        cut(q),
        cut(k),
        cut(v),
        cut(g),
        cut(g_gamma),
        cut(beta),
        scale,
        cut(initial_state),
        output_final_state,
        cu_seqlens,
    )


def forward_only_scan(q, k, v, *args, **kw):
    """cut_gradients, declared forward-only: judged on (o, ht) of every case."""
    return cut_gradients(q, k, v, *args, **kw)


forward_only_scan.__signature__ = inspect.signature(cut_gradients)  # no chunk_size, as cut_gradients


forward_only_scan.forward_only = True
