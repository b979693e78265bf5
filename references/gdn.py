"""Float64 oracle for GDN, the gated delta rule (FLA's naive_recurrent_gated_delta_rule convention).

Per sequence, value head j, with S_0 = initial_state (or 0), S_t in R^{K x V}:
    S'  = exp(g_t) S_{t-1}                               g_t = g[b, t, j] (one log-decay per head)
    S_t = S' + (beta_t k_t)^T (v_t - k_t S')             beta_t = beta[b, t, j]
    o_t = scale * q_t S_t                                 scale defaults to K ** -0.5
which is KDA (references/kda.py) with g_t on every key channel; grouped value heads as there
(HV = G * H, value head j reads q, k head j // G). q and k are used as given (the harness passes
them L2-normalised, as FLA's tests and Qwen3-Next's layer do).
Shapes: q, k [B, T, H, K]; g, beta [B, T, HV]; v [B, T, HV, V]; state [N, HV, K, V].
"""

from __future__ import annotations

import jax.numpy as jnp

from references import kda


def step(S, q, k, v, g, beta, scale):
    """One token. S [B, HV, K, V]; q, k [B, H, K]; g, beta, scale [B, HV]; v [B, HV, V]."""
    return kda.step(S, q, k, v, jnp.broadcast_to(g[..., None], g.shape + S.shape[2:3]), beta, scale)


forward, forward_backward = kda.delta_rule(step, per_head=True)
