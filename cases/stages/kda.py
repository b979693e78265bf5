"""KDA's stages (fla.ops.kda.chunk: chunk_kda_fwd / chunk_kda_bwd in fla.ops.kda.chunk_fwd,
chunk_bwd, with fla.ops.kda.chunk_intra, fla.ops.common.chunk_delta_h, fla.ops.gla.chunk and
fla.ops.utils.cumsum), in FLA 0.6.0's calling convention (keyword arguments; tensors in FLA's
[B, T, heads, ...] layout; varlen cases pass cu_seqlens [N + 1] with B == 1; chunk_size always).
q, k have H heads; v, g, beta, the states and every intermediate HV = G * H value heads (value
head j reads q, k head j // G). C = chunk_size; cd = the case dtype.

    local_cumsum  chunk_local_cumsum(g, chunk_size, scale=RCP_LN2, cu_seqlens)
                    g [B, T, HV, K] float32 (the op's log-decays)
                    -> g_cumsum [B, T, HV, K] float32: the cumsum within each chunk, times 1 / ln 2
    fwd_intra     chunk_kda_fwd_intra(q, k, v, gk, beta, scale, cu_seqlens, chunk_size,
                                      safe_gate=False, disable_recompute=False)
                    gk the log2 cumsum, beta [B, T, HV] float32
                    -> w [B, T, HV, K], u [B, T, HV, V], qg (None: FLA only stores it with
                       disable_recompute), kg [B, T, HV, K], Aqk, Akk [B, T, HV, C], all cd:
                       Aqk[t, j] = scale sum_c q_t k_j exp2(gk_t - gk_j) for chunk positions j <= t's
                       (FLA leaves Aqk's strictly upper triangle unwritten: `output_mask`),
                       Akk = (I + beta_t sum_c k_t k_j exp2(gk_t - gk_j) [j < t])^-1 (lower; 0 above),
                       w = Akk (beta k exp2(gk)), u = Akk (beta v), kg = k exp2(gk_last - gk)
    fwd_h         chunk_gated_delta_rule_fwd_h(k=kg, w, u, gk, initial_state, output_final_state,
                                               cu_seqlens, chunk_size, state_v_first=False)
                    -> h [B, NT, HV, K, V] cd (the state before each chunk), v_new [B, T, HV, V] cd
                       (u - w h), ht [N, HV, K, V] float32
    fwd_o         chunk_gla_fwd_o_gk(q, v=v_new, g=gk, A=Aqk, h, scale, cu_seqlens, chunk_size)
                    -> o [B, T, HV, V] cd: scale (q exp2(g)) h + tril(A) v_new
    bwd_dAv       chunk_kda_bwd_dAv(q, k, v=v_new, do, A=Aqk, scale, cu_seqlens, chunk_size)
                    -> dAqk [B, T, HV, C] float32 (scale do_t . v_new_j for j <= t, else 0),
                       dv [B, T, HV, V] cd (tril(A)^T do)
    bwd_dhu       chunk_gated_delta_rule_bwd_dhu(q=qg, k=kg, w, gk, h0, dht, do, dv, scale,
                                                 cu_seqlens, chunk_size, state_v_first=False)
                    qg = q exp2(gk) [B, T, HV, K] cd (FLA's backward recomputes it)
                    -> dh [B, NT, HV, K, V] cd (the gradient w.r.t. the state after each chunk),
                       dh0 [N, HV, K, V] float32, dv [B, T, HV, V] cd (dv + kg dh)
    bwd_wy        chunk_kda_bwd_wy_dqkg_fused(q, k, v, v_new, g=gk, beta, A=Akk, h, do, dh, dv,
                                              scale, cu_seqlens, chunk_size, state_v_first=False)
                    h cd (FLA's backward recomputes it), dv bwd_dhu's
                    -> dq, dk [B, T, HV, K] float32 (the state and WY parts), dv [B, T, HV, V] cd
                       (the gradient of v), db [B, T, HV] float32, dg [B, T, HV, K] float32,
                       dAkk [B, T, HV, C] float32 (the gradient w.r.t. Akk's strictly lower part
                       before its inverse)
    bwd_intra     chunk_kda_bwd_intra(q, k, g=gk, beta, dAqk, dAkk, dq, dk, db, dg, cu_seqlens,
                                      chunk_size, safe_gate=False)
                    dq, dk, db, dg bwd_wy's -> dq, dk [B, T, HV, K], db [B, T, HV], dg [B, T, HV, K],
                       float32: the inputs plus the intra-chunk parts through Aqk and Akk

The op then sums dq, dk over each head's G value heads, takes the reverse chunk-local cumsum of dg
(the gradient w.r.t. the natural-log chunk-local cumsum) as the gradient of g, and casts. FLA's
backward recomputes w, u, kg, h and v_new as the forward computes them (its recompute_w_u_fwd
takes no chunk_size and is the forward's own WY step: not a stage of its own). dht is the op's
cotangent of the final state, given only when the case returns one; h0 the op's initial state.
"""

from __future__ import annotations

import numpy as np

from cases.layouts import PER_CHUNK, STATE, TIME, Tensor, declare
from cases.stages.record import CASE_SCALE, RETURNS_FINAL_STATE, Stage, StageOp, local_cumsum_stage, num_chunks

_ORACLE = "references.stages.kda"
_JAX = "kernels_jax.kda.stages"

CHUNK_SIZES = (32, 64)  # FLA 0.6.0's KDA kernels (chunk_kda, chunk_kda_fwd_intra) take no others
MAX_K = 256  # chunk_delta_h's kernels keep the state in 64-row blocks, at most four


def check(case) -> None:
    """ValueError for what FLA 0.6.0's KDA stages do not take: chunk sizes other than 32 and 64
    (chunk_kda_fwd_intra raises for them, and chunk_kda refuses them), K > 256 (the state
    kernels of chunk_delta_h assert K <= 256)."""
    if case.chunk_size not in CHUNK_SIZES:
        raise ValueError(
            f"kda stage {case.stage!r}: chunk_size {case.chunk_size} is not one FLA 0.6.0's KDA kernels take "
            f"{CHUNK_SIZES} (chunk_kda_fwd_intra raises for any other)"
        )
    if case.K > MAX_K:
        raise ValueError(
            f"kda stage {case.stage!r}: K = {case.K} > {MAX_K} (FLA 0.6.0's chunk_delta_h asserts K <= 256)"
        )


def present(case, name: str) -> bool:
    """initial_state, h0 and dh0 with an initial state, dht and ht with a final state; qg never
    (FLA's forward stores it only with disable_recompute); everything else always."""
    rules = {"initial_state": case.h0, "h0": case.h0, "dh0": case.h0, "dht": case.ht, "ht": case.ht, "qg": False}
    return rules.get(name, True)


def tensors(case) -> dict[str, Tensor]:
    """Shape and layout of every stage input and output of `case` (FLA's layout). q and k are the op's
    [B, T, H, K] (fwd_h and bwd_dhu, where FLA passes kg and qg [B, T, HV, K] as them, declare so:
    Stage.like)."""
    B, T, H, K, V, N, C = case.B, case.T, case.H, case.K, case.V, case.N, case.chunk_size
    HV, NT = case.value_heads, num_chunks(case)
    return {
        **declare(("q", "k"), (B, T, H, K), TIME),
        **declare(("g", "g_cumsum", "gk", "w", "qg", "kg", "dq", "dk", "dg"), (B, T, HV, K), TIME),
        **declare(("v", "u", "v_new", "do", "o", "dv"), (B, T, HV, V), TIME),
        **declare(("beta", "db"), (B, T, HV), TIME),
        **declare(("A", "Aqk", "Akk", "dAqk", "dAkk"), (B, T, HV, C), TIME),
        **declare(("initial_state", "h0", "dht", "ht", "dh0"), (N, HV, K, V), STATE),
        **declare(("h", "dh"), (B, NT, HV, K, V), PER_CHUNK),
    }


# passed and returned in the case dtype (FLA keeps them in q's, k's or v's dtype); the rest float32
_CASE_DTYPE = frozenset(("q", "k", "v", "do", "o", "w", "u", "qg", "kg", "v_new", "A", "Aqk", "Akk", "h", "dh"))


def dtype(case, name: str) -> str:
    """The case dtype for q, k, v, do, o and FLA's intermediates kept in the inputs' dtype (w, u,
    qg, kg, v_new, Aqk, Akk = A, the states h and dh) and for dv (FLA's dv follows do's and v's
    dtype); float32 for the gates, beta, ht, h0, dht, dh0 and the gradients dq, dk, db, dg,
    dAqk, dAkk (FLA's float32 buffers)."""
    if name in _CASE_DTYPE or name == "dv":
        return case.dtype
    return "float32"


def output_mask(case, name: str):
    """None, or for Aqk (fwd_intra) the judged part: bool [B, T, HV, C], token t's chunk
    positions j <= t's own (FLA 0.6.0 allocates Aqk with torch.empty and writes only its lower
    triangle; the rest is whatever the memory held). Chunk positions are counted per sequence."""
    if not (case.stage == "fwd_intra" and name == "Aqk"):
        return None
    if case.seqlens is not None:
        pos = np.concatenate([np.arange(n) for n in case.seqlens]).reshape(1, -1)
    else:
        pos = np.broadcast_to(np.arange(case.T), (case.B, case.T))
    within = pos % case.chunk_size
    mask = np.arange(case.chunk_size)[None, None, :] <= within[..., None]
    return np.broadcast_to(mask[:, :, None, :], tensors(case)["Aqk"].shape).copy()


def mask_undefined(case, name: str, value):
    """`value` (numpy, stage output `name`) with what FLA leaves undefined (outside output_mask) set to 0."""
    mask = output_mask(case, name)
    return value if mask is None else np.where(mask, value, 0).astype(value.dtype)


STAGE_OP = StageOp(
    "kda",
    stages=(
        local_cumsum_stage("kda"),
        Stage(
            "kda",
            "fwd_intra",
            "fla.ops.kda.chunk_intra:chunk_kda_fwd_intra",
            ("q", "k", "v", "gk", "beta"),
            ("w", "u", "qg", "kg", "Aqk", "Akk"),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_intra",
            kernels_jax=f"{_JAX}:chunk_kda_fwd_intra",
            kwargs=(("scale", CASE_SCALE), ("safe_gate", False), ("disable_recompute", False)),
        ),
        Stage(
            "kda",
            "fwd_h",
            "fla.ops.common.chunk_delta_h:chunk_gated_delta_rule_fwd_h",
            ("k", "w", "u", "gk", "initial_state"),
            ("h", "v_new", "ht"),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_h",
            kernels_jax=f"{_JAX}:chunk_gated_delta_rule_fwd_h",
            kwargs=(("output_final_state", RETURNS_FINAL_STATE), ("state_v_first", False)),
            like=(("k", "kg"),),  # FLA passes kg as k
        ),
        Stage(
            "kda",
            "fwd_o",
            "fla.ops.gla.chunk:chunk_gla_fwd_o_gk",
            ("q", "v", "g", "A", "h"),
            ("o",),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_o",
            kernels_jax=f"{_JAX}:chunk_gla_fwd_o_gk",
            kwargs=(("scale", CASE_SCALE),),
        ),
        Stage(
            "kda",
            "bwd_dAv",
            "fla.ops.kda.chunk_bwd:chunk_kda_bwd_dAv",
            ("q", "k", "v", "do", "A"),
            ("dAqk", "dv"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dAv",
            kernels_jax=f"{_JAX}:chunk_kda_bwd_dAv",
            kwargs=(("scale", CASE_SCALE),),
        ),
        Stage(
            "kda",
            "bwd_dhu",
            "fla.ops.common.chunk_delta_h:chunk_gated_delta_rule_bwd_dhu",
            ("q", "k", "w", "gk", "h0", "dht", "do", "dv"),
            ("dh", "dh0", "dv"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dhu",
            kernels_jax=f"{_JAX}:chunk_gated_delta_rule_bwd_dhu",
            kwargs=(("scale", CASE_SCALE), ("state_v_first", False)),
            like=(("q", "qg"), ("k", "kg")),  # FLA passes qg, kg as q, k
        ),
        Stage(
            "kda",
            "bwd_wy",
            "fla.ops.kda.chunk_bwd:chunk_kda_bwd_wy_dqkg_fused",
            ("q", "k", "v", "v_new", "g", "beta", "A", "h", "do", "dh", "dv"),
            ("dq", "dk", "dv", "db", "dg", "dAkk"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_wy",
            kernels_jax=f"{_JAX}:chunk_kda_bwd_wy_dqkg_fused",
            kwargs=(("scale", CASE_SCALE), ("state_v_first", False)),
        ),
        Stage(
            "kda",
            "bwd_intra",
            "fla.ops.kda.chunk_intra:chunk_kda_bwd_intra",
            ("q", "k", "g", "beta", "dAqk", "dAkk", "dq", "dk", "db", "dg"),
            ("dq", "dk", "db", "dg"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_intra",
            kernels_jax=f"{_JAX}:chunk_kda_bwd_intra",
            kwargs=(("safe_gate", False),),
        ),
    ),
    tensors=tensors,
    dtype=dtype,
    present=present,
    inputs=f"{_ORACLE}:stage_inputs",
    check=check,
    mask_undefined=mask_undefined,
)
