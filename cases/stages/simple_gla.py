"""Simple GLA's stages (fla.ops.simple_gla.chunk: fla.ops.common.chunk_h, fla.ops.common.chunk_o,
fla.ops.utils.cumsum), in FLA 0.6.0's calling convention (keyword arguments; tensors in FLA's
[B, T, H, ...] layout; varlen cases pass cu_seqlens [N + 1] with B == 1; chunk_size always):

    local_cumsum  chunk_local_cumsum(g, chunk_size, scale=RCP_LN2, cu_seqlens)   g gates only
                    g [B, T, H] float32 (the op's raw log-decays)
                    -> g_cumsum [B, T, H] float32: the cumsum within each chunk, times 1 / ln 2
    fwd_h         chunk_fwd_h(k, v, g | g_gamma, h0, output_final_state, cu_seqlens, chunk_size,
                              states_in_fp32=False)
                    -> h [B, NT, H, K, V] in k's dtype (the state before each chunk: FLA's forward
                       keeps it in the input dtype, states_in_fp32=False), ht [N, H, K, V] float32
    fwd_o         chunk_fwd_o(q, k, v, h, g | g_gamma, scale, cu_seqlens, chunk_size)
                    h as fwd_h returns it -> o [B, T, H, V] in v's dtype
    bwd_dh        chunk_bwd_dh(q, k, v, do, h0, dht, scale, g | g_gamma, cu_seqlens, chunk_size,
                               states_in_fp32=True)
                    -> dh [B, NT, H, K, V] float32 (the gradient w.r.t. the state after each
                       chunk, from the chunks after it and dht), dh0 [N, H, K, V] float32
    bwd_dv        chunk_bwd_dv(q, k, do, dh, g | g_gamma, scale, cu_seqlens, chunk_size)
                    -> dv [B, T, H, V] in do's dtype
    bwd_dqkwg     chunk_bwd_dqkwg(q, k, v, do, h, dh, g | g_gamma, scale, cu_seqlens, chunk_size)
                    h float32 (FLA's backward recomputes it with states_in_fp32=True)
                    -> dq, dk [B, T, H, K] in q's dtype, dw (None: simple_gla has no w; FLA's
                       function returns four), dg [B, T, H] float32 (g gates: the gradient
                       w.r.t. the chunk-local cumsum, before FLA's reverse cumsum)

Gates reach the stages after the cumsum: g is the chunk-local cumsum of the op's g times 1 / ln 2
(RCP_LN2: FLA 0.6.0's kernels take exp2), g_gamma the op's g_gamma times 1 / ln 2. NT counts
chunks per row (B rows) or over all packed sequences (varlen, B == 1), as FLA's
prepare_chunk_offsets does. dht is the op's cotangent of the final state, given only when the case
returns one (FLA's autograd passes None otherwise); h0 the op's initial state when the case has one.
"""

from __future__ import annotations

from cases.layouts import PER_CHUNK, PER_HEAD, STATE, TIME, Tensor, declare
from cases.stages.record import CASE_SCALE, RETURNS_FINAL_STATE, Stage, StageOp, local_cumsum_stage, num_chunks

_H = "fla.ops.common.chunk_h"
_O = "fla.ops.common.chunk_o"
_ORACLE = "references.stages.simple_gla"
_JAX = "kernels_jax.simple_gla.stages"


def present(case, name: str) -> bool:
    """h0 and dh0 with an initial state, dht and ht with a final state, dg with a g gate; dw never
    (simple_gla has no w); everything else always."""
    rules = {"h0": case.h0, "dh0": case.h0, "dht": case.ht, "ht": case.ht, "dg": not case.uses_g_gamma, "dw": False}
    return rules.get(name, True)


def tensors(case) -> dict[str, Tensor]:
    """Shape and layout of every stage input and output of `case` (FLA's layout)."""
    B, T, H, K, V, N = case.B, case.T, case.H, case.K, case.V, case.N
    NT = num_chunks(case)
    gate = ((H,), PER_HEAD) if case.uses_g_gamma else ((B, T, H), TIME)
    return {
        **declare(("q", "k", "dq", "dk"), (B, T, H, K), TIME),
        **declare(("v", "do", "o", "dv"), (B, T, H, V), TIME),
        **declare(("g", "g_gamma", "g_cumsum", "dg"), *gate),
        **declare(("h0", "dht", "ht", "dh0"), (N, H, K, V), STATE),
        **declare(("h", "dh"), (B, NT, H, K, V), PER_CHUNK),
    }


def dtype(case, name: str) -> str:
    """The case dtype for q, k, v, do and their gradients; float32 for gates, ht, h0, dht, dh, dh0
    and h (FLA's backward recomputes it in float32; fwd_h and fwd_o, where FLA's forward keeps
    states in k's dtype, declare their h in the case dtype: Stage.case_dtype)."""
    if name in ("q", "k", "v", "do", "o", "dq", "dk", "dv"):
        return case.dtype
    return "float32"


STAGE_OP = StageOp(
    "simple_gla",
    stages=(
        local_cumsum_stage("simple_gla"),
        Stage(
            "simple_gla",
            "fwd_h",
            f"{_H}:chunk_fwd_h",
            ("k", "v", "gate", "h0"),
            ("h", "ht"),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_h",
            kernels_jax=f"{_JAX}:chunk_fwd_h",
            kwargs=(("output_final_state", RETURNS_FINAL_STATE), ("states_in_fp32", False)),
            case_dtype=("h",),  # FLA's forward keeps the states in k's dtype (states_in_fp32=False)
        ),
        Stage(
            "simple_gla",
            "fwd_o",
            f"{_O}:chunk_fwd_o",
            ("q", "k", "v", "h", "gate"),
            ("o",),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_o",
            kernels_jax=f"{_JAX}:chunk_fwd_o",
            kwargs=(("scale", CASE_SCALE),),
            case_dtype=("h",),  # FLA's forward keeps the states in k's dtype (states_in_fp32=False)
        ),
        Stage(
            "simple_gla",
            "bwd_dh",
            f"{_H}:chunk_bwd_dh",
            ("q", "k", "v", "do", "h0", "dht", "gate"),
            ("dh", "dh0"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dh",
            kernels_jax=f"{_JAX}:chunk_bwd_dh",
            kwargs=(("scale", CASE_SCALE), ("states_in_fp32", True)),
        ),
        Stage(
            "simple_gla",
            "bwd_dv",
            f"{_O}:chunk_bwd_dv",
            ("q", "k", "do", "dh", "gate"),
            ("dv",),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dv",
            kernels_jax=f"{_JAX}:chunk_bwd_dv",
            kwargs=(("scale", CASE_SCALE),),
        ),
        Stage(
            "simple_gla",
            "bwd_dqkwg",
            f"{_O}:chunk_bwd_dqkwg",
            ("q", "k", "v", "do", "h", "dh", "gate"),
            ("dq", "dk", "dw", "dg"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dqkwg",
            kernels_jax=f"{_JAX}:chunk_bwd_dqkwg",
            kwargs=(("scale", CASE_SCALE),),
        ),
    ),
    tensors=tensors,
    dtype=dtype,
    present=present,
    inputs=f"{_ORACLE}:stage_inputs",
)
