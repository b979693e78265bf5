"""chunk_gdn2: GDN-2 (Gated DeltaNet-2) by chunks, forward and backward, on the KDA kernels.

Recurrence (FLA's fla/ops/gdn2/naive.py), per sequence and value head, state S [K, V]:
    S_t = (I - k_t (b_t * k_t)^T) Diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T;  o_t = scale q_t S_t
with g [B, T, HV, K] the per-channel log-decay, b [B, T, HV, K] the erase gate (on the key
channels) and w [B, T, HV, V] the write gate (on the value channels); b = beta 1_K, w = beta 1_V
is KDA. In KDA's WY form (kernels_jax/kda) beta k becomes b k and beta v becomes w v:
    A_kk[i, j] = sum_c b_i[c] k_i[c] k_j[c] exp(G_i[c] - G_j[c])  (j < i),  Inv = (I + A_kk)^-1
    W = Inv (b k exp(G)),  U = Inv (w v);  v_new = U - W S  (then KDA's recurrence unchanged)
The recurrence kernels (kda_recurrence_fwd, kda_recurrence_bwd) are KDA's own: they never see
the gates. The intra-chunk and per-chunk-gradient kernels are KDA's with the gates (b, w) in
place of (beta,) (gdn2_intra, gdn2_chunk_grads); the backward gives db per K channel and dw per
V channel where KDA gives dbeta.
"""

from __future__ import annotations

from kernels_jax.kda.chunk import channel_gated_delta_rule


def chunk_gdn2(
    q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """GDN-2, chunked (FLA's chunk_gdn2 convention).

    q, k [B, T, H, K] (L2-normalised by the caller), v [B, T, HV, V] (HV = G * H: value head j
    reads q, k head j // G); g [B, T, HV, K] per-channel log-decay; b [B, T, HV, K] erase gate;
    w [B, T, HV, V] write gate; initial_state [N, HV, K, V] float32 (N = B, or the number of
    packed sequences with cu_seqlens [N + 1] and B == 1). Returns (o [B, T, HV, V] in q's dtype,
    final_state [N, HV, K, V] float32 or None).
    """
    return channel_gated_delta_rule(q, k, v, g, b, w, scale, initial_state, output_final_state, cu_seqlens, chunk_size)
