"""GDN's stages (fla.ops.gated_delta_rule.chunk: fla.ops.utils.cumsum, gated_delta_rule.chunk_fwd,
gated_delta_rule.wy_fast, common.chunk_delta_h, common.chunk_o), in FLA 0.6.0's calling convention
(keyword arguments; tensors in FLA's [B, T, H, ...] layout; varlen cases pass cu_seqlens [N + 1]
with B == 1; chunk_size always; state_v_first left at its default False, as the op passes it).
HV = G * H value heads (FLA's GVA: value head j reads q, k head j // G) are taken as the op takes
them; q, k, dq, dk, dk2 have H heads, everything else HV.

    local_cumsum   chunk_local_cumsum(g, chunk_size, scale=RCP_LN2, cu_seqlens)
                     g [B, T, HV] float32 (the op's log-decays) -> g_cumsum [B, T, HV] float32
    fwd_intra      chunk_gated_delta_rule_fwd_intra(k, v, g, beta, cu_seqlens, chunk_size)
                     -> w [B, T, HV, K] in k's dtype, u [B, T, HV, V] in v's dtype,
                        A [B, T, HV, C] in k's dtype: per chunk A = (I + M)^-1 with
                        M_ij = beta_i (k_i . k_j) exp2(g_i - g_j) for j < i (row i: token i, column
                        j: its chunk position; columns past a short chunk's end 0),
                        w = A (beta exp2(g) k), u = A (beta v)
    fwd_h          chunk_gated_delta_rule_fwd_h(k, w, u, g, initial_state, output_final_state,
                                               cu_seqlens, chunk_size)
                     -> h [B, NT, HV, K, V] in k's dtype (the state before each chunk),
                        v_new [B, T, HV, V] in u's dtype (u - w h), ht [N, HV, K, V] float32
    fwd_o          chunk_fwd_o(q, k, v, h, g, scale, cu_seqlens, chunk_size)
                     v: fwd_h's v_new; h as fwd_h returns it -> o [B, T, HV, V] in v's dtype
    bwd_dv_local   chunk_bwd_dv_local(q, k, do, g, scale, cu_seqlens, chunk_size)
                     -> dv [B, T, HV, V] in do's dtype: the gradient of v_new from o inside the chunk
    bwd_dhu        chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dv, g, h0, dht, scale, cu_seqlens,
                                                  chunk_size)
                     dv: bwd_dv_local's; h0 only says whether dh0 is wanted
                     -> dh [B, NT, HV, K, V] in q's dtype (the gradient w.r.t. the state after each
                        chunk, from the chunks after it and dht), dh0 [N, HV, K, V] float32,
                        dv2 [B, T, HV, V] in dv's dtype (the whole gradient of v_new)
    bwd_dqkwg      chunk_bwd_dqkwg(q, k, v, do, h, dh, w, g, dv, scale, cu_seqlens, chunk_size)
                     v: v_new; h: fwd_h's (k's dtype); dh: bwd_dhu's; dv: bwd_dhu's dv2
                     -> dq, dk [B, T, H, K] in q's, k's dtype (summed over each group of value
                        heads), dw [B, T, HV, K] in w's dtype (-dv2 h^T), dg [B, T, HV] float32
    bwd_wy         prepare_wy_repr_bwd(k, v, beta, A, dw, du, g, cu_seqlens)
                     dw: bwd_dqkwg's; du: bwd_dhu's dv2
                     -> dk2 [B, T, H, K] in k's dtype (summed over each group), dv [B, T, HV, V]
                        in v's dtype, db [B, T, HV] in beta's dtype (float32), dg2 [B, T, HV]
                        float32

Gates reach the stages after the cumsum: g is the chunk-local cumsum of the op's g times 1 / ln 2
(RCP_LN2: FLA 0.6.0's kernels take exp2). dg and dg2 are gradients w.r.t. that cumsum in
natural-log units; FLA's op adds them and takes the reverse chunk-local cumsum as the op's dg
(dk = dk + dk2). NT counts chunks per row (B rows) or over all packed sequences (varlen, B == 1).
initial_state (fwd_h) and h0 (bwd_dhu) are the op's initial state when the case has one; dht the
op's cotangent of the final state, given only when the case returns one.
FLA's backward recomputes w, u (recompute_w_u_fwd, the forward's own WY step, which fwd_intra
runs too: not a stage of its own), h and v_new as the forward computes them. prepare_wy_repr_bwd
takes no chunk_size (FLA reads it from A's last axis): the harness must not pass it one.
"""

from __future__ import annotations

from cases.layouts import PER_CHUNK, STATE, TIME, Tensor, declare
from cases.stages.record import CASE_SCALE, RETURNS_FINAL_STATE, Stage, StageOp, local_cumsum_stage, num_chunks

_ORACLE = "references.stages.gdn"
_JAX = "kernels_jax.gdn.stages"
FLA_CHUNKS = (16, 32, 64)  # chunk_gated_delta_rule_fwd_intra (and the op) take these only
FLA_MAX_K = 256  # chunk_delta_h's kernels assert K <= 256


def check(case) -> None:
    """ValueError for what FLA 0.6.0's gdn stages do not take: chunk sizes other than 16, 32, 64
    (chunk_gated_delta_rule_fwd_intra raises, and chunk_gated_delta_rule refuses them for the
    op), and K > 256 (chunk_gated_delta_rule_fwd_h and _bwd_dhu assert K <= 256; every stage is
    refused so that a case's stages come as a whole)."""
    if case.chunk_size not in FLA_CHUNKS:
        raise ValueError(
            f"gdn's stages take chunk_size in {FLA_CHUNKS} (FLA 0.6.0's chunk_gated_delta_rule_fwd_intra and "
            f"chunk_gated_delta_rule refuse others), the case has {case.chunk_size}"
        )
    if case.K > FLA_MAX_K:
        raise ValueError(
            f"gdn's stages take K <= {FLA_MAX_K} (FLA 0.6.0's chunk_gated_delta_rule_fwd_h and _bwd_dhu assert it), "
            f"the case has K={case.K}"
        )


def present(case, name: str) -> bool:
    """initial_state, h0 and dh0 with an initial state; dht and ht with a final state; everything
    else always (gdn has g gates only)."""
    rules = {"initial_state": case.h0, "h0": case.h0, "dh0": case.h0, "dht": case.ht, "ht": case.ht}
    return rules.get(name, True)


def tensors(case) -> dict[str, Tensor]:
    """Shape and layout of every stage input and output of `case` (FLA's layout)."""
    B, T, H, K, V, N, HV = case.B, case.T, case.H, case.K, case.V, case.N, case.value_heads
    NT = num_chunks(case)
    return {
        **declare(("q", "k", "dq", "dk", "dk2"), (B, T, H, K), TIME),
        **declare(("w", "dw"), (B, T, HV, K), TIME),
        **declare(("v", "u", "v_new", "o", "do", "dv", "dv2", "du"), (B, T, HV, V), TIME),
        **declare(("g", "g_cumsum", "beta", "dg", "dg2", "db"), (B, T, HV), TIME),
        **declare(("A",), (B, T, HV, case.chunk_size), TIME),
        **declare(("initial_state", "h0", "dht", "ht", "dh0"), (N, HV, K, V), STATE),
        **declare(("h", "dh"), (B, NT, HV, K, V), PER_CHUNK),
    }


def dtype(case, name: str) -> str:
    """float32 for the gates (g, g_cumsum, beta), their gradients (dg, dg2, db) and the op's states
    (initial_state, h0, ht, dht, dh0); the case dtype for everything else: q, k, v, do and their
    gradients, and FLA's intermediates, which it keeps in k's, v's or q's dtype (w, u, A, h,
    v_new, dv, dv2, du, dh, dw)."""
    if name in ("g", "g_cumsum", "beta", "dg", "dg2", "db", "initial_state", "h0", "ht", "dht", "dh0"):
        return "float32"
    return case.dtype


STAGE_OP = StageOp(
    "gdn",
    stages=(
        local_cumsum_stage("gdn"),
        Stage(
            "gdn",
            "fwd_intra",
            "fla.ops.gated_delta_rule.chunk_fwd:chunk_gated_delta_rule_fwd_intra",
            ("k", "v", "g", "beta"),
            ("w", "u", "A"),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_intra",
            kernels_jax=f"{_JAX}:chunk_gated_delta_rule_fwd_intra",
        ),
        Stage(
            "gdn",
            "fwd_h",
            "fla.ops.common.chunk_delta_h:chunk_gated_delta_rule_fwd_h",
            ("k", "w", "u", "g", "initial_state"),
            ("h", "v_new", "ht"),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_h",
            kernels_jax=f"{_JAX}:chunk_gated_delta_rule_fwd_h",
            kwargs=(("output_final_state", RETURNS_FINAL_STATE),),
        ),
        Stage(
            "gdn",
            "fwd_o",
            "fla.ops.common.chunk_o:chunk_fwd_o",
            ("q", "k", "v", "h", "g"),
            ("o",),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_o",
            kernels_jax=f"{_JAX}:chunk_fwd_o",
            kwargs=(("scale", CASE_SCALE),),
        ),
        Stage(
            "gdn",
            "bwd_dv_local",
            "fla.ops.common.chunk_o:chunk_bwd_dv_local",
            ("q", "k", "do", "g"),
            ("dv",),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dv_local",
            kernels_jax=f"{_JAX}:chunk_bwd_dv_local",
            kwargs=(("scale", CASE_SCALE),),
        ),
        Stage(
            "gdn",
            "bwd_dhu",
            "fla.ops.common.chunk_delta_h:chunk_gated_delta_rule_bwd_dhu",
            ("q", "k", "w", "do", "dv", "g", "h0", "dht"),
            ("dh", "dh0", "dv2"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dhu",
            kernels_jax=f"{_JAX}:chunk_gated_delta_rule_bwd_dhu",
            kwargs=(("scale", CASE_SCALE),),
        ),
        Stage(
            "gdn",
            "bwd_dqkwg",
            "fla.ops.common.chunk_o:chunk_bwd_dqkwg",
            ("q", "k", "v", "do", "h", "dh", "w", "g", "dv"),
            ("dq", "dk", "dw", "dg"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dqkwg",
            kernels_jax=f"{_JAX}:chunk_bwd_dqkwg",
            kwargs=(("scale", CASE_SCALE),),
        ),
        Stage(
            "gdn",
            "bwd_wy",
            "fla.ops.gated_delta_rule.wy_fast:prepare_wy_repr_bwd",
            ("k", "v", "beta", "A", "dw", "du", "g"),
            ("dk2", "dv", "db", "dg2"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_wy",
            kernels_jax=f"{_JAX}:prepare_wy_repr_bwd",
            takes_chunk_size=False,  # FLA reads it from A's last axis
        ),
    ),
    tensors=tensors,
    dtype=dtype,
    present=present,
    inputs=f"{_ORACLE}:stage_inputs",
    check=check,
)
