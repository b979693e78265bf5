"""Candidates that change the process's global state (tests only: tests/test_isolation.py).

`simple_gla`: Simple GLA by its recurrence in plain JAX, its float32 einsums at jax's default
precision (one bfloat16 MXU pass on a TPU, which the TPU numerics model computes): alone it fails
the bound against FLA. tests/state_highest.py and tests/state_x64.py import it after setting
jax_default_matmul_precision to "highest" and jax_enable_x64 at import, as research code does.

Torch candidates, Simple GLA by its recurrence in torch (float32):
    sets_float64   sets torch's default dtype to float64 in its call and leaves it so
    writes_inputs  zeroes q, k and v in place after computing its result
"""

import jax.numpy as jnp

from tests.platform_candidates import _xla as xla_simple_gla


def simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False):
    """S_t = exp(g_t) S_{t-1} + k_t^T v_t;  o_t = scale * q_t S_t by its scan over tokens
    (tests/platform_candidates.py's plain-XLA form), its einsum's precision left to jax's
    configuration. q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] or g_gamma [H]."""
    g = jnp.broadcast_to(g_gamma, q.shape[:3]) if g is None else g
    return xla_simple_gla(q, k, v, g=g, scale=scale, initial_state=initial_state, output_final_state=output_final_state)


def _torch_simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state):
    import torch

    B, T, H, K = q.shape
    scale = K**-0.5 if scale is None else scale
    g = g_gamma.expand(B, T, H) if g is None else g
    S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float32) if initial_state is None else initial_state.clone()
    o = []
    for t in range(T):
        S = torch.exp(g[:, t])[..., None, None] * S + k[:, t, :, :, None].float() * v[:, t, :, None, :].float()
        o.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t].float(), S))
    return torch.stack(o, 1).to(v.dtype), (S if output_final_state else None)


def sets_float64(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False):
    import torch

    out = _torch_simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state)
    torch.set_default_dtype(torch.float64)
    return out


def writes_inputs(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False):
    out = _torch_simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state)
    for x in (q, k, v):
        x.data.zero_()
    return out
