"""chunk_gdn: the gated delta rule by chunks, forward and backward, on the KDA kernels.

Recurrence (references/gdn.py), per sequence and value head, state S [K, V]:
    S' = exp(g_t) S_{t-1};  S_t = S' + (beta_t k_t)^T (v_t - k_t S');  o_t = scale q_t S_t
which is KDA's with the one log-decay of the head on every key channel: the KDA kernels
(kernels_jax/kda) run it with g broadcast over K, and dg is their per-channel gradient summed
over K (by jax, through the broadcast).
"""

from __future__ import annotations

from kernels_jax.kda.chunk import delta_rule


def chunk_gdn(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """Gated delta rule, chunked (FLA's chunk_gated_delta_rule convention).

    q, k [B, T, H, K] (L2-normalised by the caller), v [B, T, HV, V] (HV = G * H: value head j
    reads q, k head j // G); g [B, T, HV] per-head log-decay; beta [B, T, HV]; initial_state
    [N, HV, K, V] float32 (N = B, or the number of packed sequences with cu_seqlens [N + 1] and
    B == 1). Returns (o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None).
    """
    return delta_rule("gdn", q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, chunk_size)
