"""Kernels that come as an explicit forward and backward (as Pallas and Triton kernels usually
do), made a function in FLA's calling convention that jax differentiates: `fla_op_from_fwd_bwd`
wraps the pair in a `jax.custom_vjp`, so the harness's `jax.vjp` runs your backward, not
autodiff through your forward.

    fwd(q, k, v, g, h0, scale) -> (o, ht, residuals)
    bwd(scale, residuals, do, dht) -> (dq, dk, dv, dg, dh0)

q, k [B, T, H, K]; v, do [B, T, H, V]; g, dg [B, T, H] (log decay per token); h0, ht, dht,
dh0 [B, H, K, V] float32. Each gradient has its input's dtype.

`recurrent_simple_gla` is an example pair: Simple GLA by its per-token recurrence with a
hand-written backward (the reverse recurrence of the state's gradient).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def fla_op_from_fwd_bwd(fwd, bwd):
    """A Simple GLA function in FLA's calling convention from an explicit (fwd, bwd) pair."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
    def op(q, k, v, g, h0, scale):
        o, ht, _ = fwd(q, k, v, g, h0, scale)
        return o, ht

    def op_fwd(q, k, v, g, h0, scale):
        o, ht, residuals = fwd(q, k, v, g, h0, scale)
        return (o, ht), residuals

    def op_bwd(scale, residuals, cotangents):
        do, dht = cotangents
        return bwd(scale, residuals, do, dht)

    op.defvjp(op_fwd, op_bwd)

    def simple_gla(
        q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None
    ):
        if cu_seqlens is not None:
            raise NotImplementedError("varlen (cu_seqlens) is not implemented by this kernel")
        B, T, H, K = q.shape
        if g is None:  # a decay per head: jax sums the per-token gradient into dg_gamma
            g = jnp.broadcast_to(g_gamma, (B, T, H))
        h0 = jnp.zeros((B, H, K, v.shape[-1]), jnp.float32) if initial_state is None else initial_state
        o, ht = op(q, k, v, g, h0, K**-0.5 if scale is None else float(scale))
        return o, (ht if output_final_state else None)

    return simple_gla


def _recurrent_fwd(q, k, v, g, h0, scale):
    """S_t = exp(g_t) S_(t-1) + k_t^T v_t;  o_t = scale q_t S_t. Keeps every S_(t-1)."""
    f32 = lambda x: jnp.moveaxis(x.astype(jnp.float32), 1, 0)  # [T, B, H, ...]

    def step(state, x):  # state [B, H, K, V]
        qt, kt, vt, gt = x
        new = state * jnp.exp(gt)[..., None, None] + jnp.einsum("bhk,bhv->bhkv", kt, vt, precision=HIGHEST)
        return new, (jnp.einsum("bhk,bhkv->bhv", qt, new, precision=HIGHEST) * scale, state)

    ht, (o, before) = jax.lax.scan(step, h0.astype(jnp.float32), (f32(q), f32(k), f32(v), f32(g)))
    return jnp.moveaxis(o, 0, 1).astype(v.dtype), ht, (q, k, v, g, h0, before)


def _recurrent_bwd(scale, residuals, do, dht):
    """The reverse recurrence: dS_t = exp(g_(t+1)) dS_(t+1) + scale q_t^T do_t, from dS_T = dht."""
    q, k, v, g, h0, before = residuals
    f32 = lambda x: jnp.moveaxis(x.astype(jnp.float32), 1, 0)
    ein = lambda spec, *xs: jnp.einsum(spec, *xs, precision=HIGHEST)

    def step(ds, x):  # ds [B, H, K, V]: the gradient of S_t from the steps after t
        qt, kt, vt, gt, dot, prev = x
        decay = jnp.exp(gt)[..., None, None]
        state = prev * decay + ein("bhk,bhv->bhkv", kt, vt)
        ds = ds + scale * ein("bhk,bhv->bhkv", qt, dot)
        grads = (
            scale * ein("bhv,bhkv->bhk", dot, state),
            ein("bhkv,bhv->bhk", ds, vt),
            ein("bhk,bhkv->bhv", kt, ds),
            jnp.sum(ds * prev * decay, axis=(-2, -1)),
        )
        return ds * decay, grads

    xs = (f32(q), f32(k), f32(v), f32(g), f32(do), before)
    dh0, (dq, dk, dv, dg) = jax.lax.scan(step, dht.astype(jnp.float32), xs, reverse=True)
    back = lambda d, like: jnp.moveaxis(d, 0, 1).astype(like.dtype)
    return back(dq, q), back(dk, k), back(dv, v), back(dg, g), dh0.astype(h0.dtype)


recurrent_simple_gla = fla_op_from_fwd_bwd(_recurrent_fwd, _recurrent_bwd)
