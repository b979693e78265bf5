"""Small candidates in FLA's calling convention for the backend-spec, unsupported and diff tests.

`gamma_only_raises` / `gamma_only_supports`: Simple GLA with g_gamma gating only (no varlen),
one saying so by raising NotImplementedError, the other by its `supports(case)` attribute.
`perturbed_1x` / `perturbed_3x`: a correct recurrence plus 1x or 3x a fixed small
perturbation of o (an error growth that stays inside tolerance, for `parity diff`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _simple_gla_gamma(q, k, v, g_gamma, scale=None, initial_state=None, output_final_state=False):
    """Per-token recurrence in float32: S_t = exp(g_gamma) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.
    q, k [B, T, H, K]; v [B, T, H, V]; g_gamma [H]; initial_state [B, H, K, V]."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    h0 = jnp.zeros((B, H, K, V), jnp.float32) if initial_state is None else f32(initial_state)
    decay = jnp.exp(f32(g_gamma))[None, :, None, None]

    def step(state, x):
        qt, kt, vt = x  # [B, H, K], [B, H, K], [B, H, V]
        state = state * decay + kt[..., :, None] * vt[..., None, :]
        return state, scale * jnp.einsum("bhk,bhkv->bhv", qt, state, precision=jax.lax.Precision.HIGHEST)

    xs = tuple(jnp.moveaxis(f32(a), 1, 0) for a in (q, k, v))
    ht, o = jax.lax.scan(step, h0, xs)
    return jnp.moveaxis(o, 0, 1).astype(v.dtype), (ht if output_final_state else None)


def gamma_only_raises(
    q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Simple GLA for g_gamma gating only; anything else raises NotImplementedError."""
    if g_gamma is None or cu_seqlens is not None:
        raise NotImplementedError("only g_gamma gating, without varlen")
    return _simple_gla_gamma(q, k, v, g_gamma, scale, initial_state, output_final_state)


def gamma_only_supports(
    q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same kernel, saying what it supports before it is called."""
    return _simple_gla_gamma(q, k, v, g_gamma, scale, initial_state, output_final_state)


def _gamma_only(case) -> bool | str:
    return True if case.uses_g_gamma and case.seqlens is None else "g_gamma gating only, without varlen"


gamma_only_supports.supports = _gamma_only


def _perturbed(times: float):
    def fn(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        o, ht = _simple_gla_gamma(q, k, v, g_gamma, scale, initial_state, output_final_state)
        wiggle = jnp.sin(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
        return (o.astype(jnp.float32) + times * 1e-5 * wiggle * jnp.abs(o).mean()).astype(o.dtype), ht

    return fn


perturbed_1x = _perturbed(1.0)
perturbed_3x = _perturbed(3.0)


def kda_with_chunk(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """kernels_jax's chunk_kda behind a user's name: a candidate that takes a chunk size."""
    from kernels_jax.kda import chunk_kda

    return chunk_kda(
        q,
        k,
        v,
        g,
        beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )


def _identity_without_derivative():
    """An identity jax primitive with no differentiation rule (jax raises NotImplementedError)."""
    from jax.extend.core import Primitive

    prim = Primitive("identity_without_derivative")
    prim.def_impl(lambda x: x)
    prim.def_abstract_eval(lambda x: x)
    return prim


_NO_DERIVATIVE = _identity_without_derivative()


def no_gradient(
    q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Correct forward through a jax primitive that has no differentiation rule: jax raises
    NotImplementedError on the backward, which is a failure, not 'unsupported'."""
    o, ht = _simple_gla_gamma(q, k, v, g_gamma, scale, initial_state, output_final_state)
    return _NO_DERIVATIVE.bind(o), ht
