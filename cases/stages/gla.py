"""GLA's stages (fla.ops.gla.chunk: chunk_gla_fwd / chunk_gla_bwd, with fla.ops.common.chunk_h and
fla.ops.utils.cumsum), in FLA 0.6.0's calling convention (keyword arguments; tensors in FLA's
[B, T, H, ...] layout; varlen cases pass cu_seqlens [N + 1] with B == 1; chunk_size always; C the
chunk size, NT the chunks per row or over all packed sequences):

    local_cumsum   chunk_local_cumsum(g, chunk_size, scale=RCP_LN2, cu_seqlens)
                     g [B, T, H, K] float32 (the op's raw per-channel log-decays)
                     -> g_cumsum [B, T, H, K] float32: the cumsum within each chunk, times 1 / ln 2
    fwd_h          chunk_fwd_h(k, v, gk, h0, output_final_state, cu_seqlens, chunk_size,
                               states_in_fp32=False)
                     gk: the log2 chunk-local cumsum (FLA's op passes g_cumsum as gk)
                     -> h [B, NT, H, K, V] in k's dtype (the state before each chunk),
                        ht [N, H, K, V] float32
    fwd_intra      chunk_gla_fwd_intra_gk(q, k, g, scale, cu_seqlens, chunk_size)
                     -> A [B, T, H, C] float32: row t, column s (s, t positions in t's chunk)
                        A = scale sum_k q_tk k_sk exp2(g_tk - g_sk) for s <= t; 0 above the
                        diagonal inside each 16-wide diagonal block; the blocks right of the
                        diagonal block are never written by FLA (torch.empty: undefined)
    fwd_o          chunk_gla_fwd_o_gk(q, v, g, A, h, scale, cu_seqlens, chunk_size)
                     A as fwd_intra returns it (only s <= t is read), h as fwd_h returns it
                     -> o [B, T, H, V] in v's dtype
    bwd_dh         chunk_bwd_dh(q, k, v, do, h0, dht, scale, gk, cu_seqlens, chunk_size,
                                states_in_fp32=True)
                     -> dh [B, NT, H, K, V] float32 (the gradient w.r.t. the state after each
                        chunk, from the chunks after it and dht), dh0 [N, H, K, V] float32
    bwd_dv         chunk_gla_bwd_dv(k, g, A, do, dh, cu_seqlens, chunk_size)
                     A the forward's (fwd_intra's), dh as bwd_dh returns it
                     -> dv [B, T, H, V] in do's dtype
    bwd_dA         chunk_gla_bwd_dA(v, do, scale, cu_seqlens, chunk_size)
                     -> dA [B, T, H, C] float32: scale do_t . v_s for s <= t, 0 above
    bwd_dqk_intra  chunk_gla_bwd_dqk_intra(q, k, g, dA, cu_seqlens, chunk_size)
                     -> dq, dk [B, T, H, K] float32: the gradients through A alone
                        (dq_t = sum_{s<=t} dA_ts k_s exp2(g_t - g_s), dk_s = sum_{t>=s} ...)
    bwd_dqkg       chunk_gla_bwd_dqkg(q, k, v, h, g, do, dh, dq, dk, scale, cu_seqlens,
                                      chunk_size)
                     h float32 (FLA's backward recomputes it with states_in_fp32=True),
                     dq, dk as bwd_dqk_intra returns them
                     -> dq, dk [B, T, H, K] float32 (all of the gradients; FLA's op then casts
                        them to q's dtype), dg [B, T, H, K] float32: the gradient of the op's
                        raw g (the reverse chunk-local cumsum is inside this kernel)

Gates reach the stages after the cumsum: g (gk) is the chunk-local cumsum of the op's g times
1 / ln 2 (RCP_LN2: FLA 0.6.0's kernels take exp2). dht is the op's cotangent of the final state,
given only when the case returns one (FLA's autograd passes None otherwise); h0 the op's initial
state when the case has one. FLA's whole op fixes its chunk at 64 (T >= 64); its stage
functions take the case's chunk size (16, 32, 64 or 128).

fwd_intra's A is judged on its defined entries only: `mask_undefined` zeroes the rest, for any
backend's output.
"""

from __future__ import annotations

import numpy as np

from cases.layouts import PER_CHUNK, STATE, TIME, Tensor, declare
from cases.stages.record import CASE_SCALE, RETURNS_FINAL_STATE, Stage, StageOp, local_cumsum_stage, num_chunks

_H = "fla.ops.common.chunk_h"
_G = "fla.ops.gla.chunk"
_ORACLE = "references.stages.gla"
_JAX = "kernels_jax.gla.stages"

# stage tensors FLA keeps in float32 whatever the case dtype (h: but in the forward's stages, see dtype)
_FP32 = frozenset(("g", "gk", "g_cumsum", "dg", "A", "dA", "h", "h0", "ht", "dht", "dh", "dh0", "dq", "dk"))


def present(case, name: str) -> bool:
    """h0 and dh0 with an initial state, dht and ht with a final state; everything else always."""
    rules = {"h0": case.h0, "dh0": case.h0, "dht": case.ht, "ht": case.ht}
    return rules.get(name, True)


def tensors(case) -> dict[str, Tensor]:
    """Shape and layout of every stage input and output of `case` (FLA's layout)."""
    B, T, H, K, V, N, C = case.B, case.T, case.H, case.K, case.V, case.N, case.chunk_size
    NT = num_chunks(case)
    return {
        **declare(("q", "k", "g", "gk", "g_cumsum", "dq", "dk", "dg"), (B, T, H, K), TIME),
        **declare(("v", "do", "o", "dv"), (B, T, H, V), TIME),
        **declare(("A", "dA"), (B, T, H, C), TIME),
        **declare(("h0", "dht", "ht", "dh0"), (N, H, K, V), STATE),
        **declare(("h", "dh"), (B, NT, H, K, V), PER_CHUNK),
    }


def dtype(case, name: str) -> str:
    """float32 for gates, A, dA, every state, and dq, dk (FLA's backward stages keep them in
    float32; its op casts the final ones to q's dtype; bwd_dqkg's h is recomputed in float32);
    the case dtype for q, k, v, do, o, dv. fwd_h and fwd_o, where FLA's forward keeps states in
    k's dtype, declare their h in the case dtype (Stage.case_dtype)."""
    return "float32" if name in _FP32 else case.dtype


def check(case) -> None:
    """ValueError for what FLA's gla stage functions do not take: only per-channel g gates
    [B, T, H, K] (gla has no g_gamma) and no grouped value heads (FLA's gla kernels index v and
    the state by the q, k head)."""
    if case.uses_g_gamma:
        raise ValueError(f"gla's stages take a per-channel g gate, not {case.gate!r}")
    if case.HV is not None and case.HV != case.H:
        raise ValueError(f"gla's stages take no grouped value heads (HV={case.HV}, H={case.H})")


def chunk_positions(case):
    """int [B, T]: each token's position in its chunk (chunks restart at every packed sequence)."""
    C = case.chunk_size
    if case.seqlens is None:
        return np.broadcast_to(np.arange(case.T) % C, (case.B, case.T))
    return np.concatenate([np.arange(n) % C for n in case.seqlens])[None, :]


def mask_undefined(case, name: str, value):
    """`value` (numpy, stage output `name`) with the entries FLA's stage function leaves undefined
    set to 0: A's (fwd_intra's) entries above the diagonal, column j > the row's position in its
    chunk (FLA writes zeros inside the 16-wide diagonal blocks and nothing right of them: its
    A is torch.empty there; every consumer reads j <= i only). Other outputs as they are."""
    if name != "A":
        return value
    keep = np.arange(case.chunk_size)[None, None, None, :] <= chunk_positions(case)[:, :, None, None]
    return np.where(keep, value, 0).astype(value.dtype)


STAGE_OP = StageOp(
    "gla",
    stages=(
        local_cumsum_stage("gla"),
        Stage(
            "gla",
            "fwd_h",
            f"{_H}:chunk_fwd_h",
            ("k", "v", "gk", "h0"),
            ("h", "ht"),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_h",
            kernels_jax=f"{_JAX}:chunk_fwd_h",
            kwargs=(("output_final_state", RETURNS_FINAL_STATE), ("states_in_fp32", False)),
            case_dtype=("h",),  # FLA's forward keeps the states in k's dtype (states_in_fp32=False)
        ),
        Stage(
            "gla",
            "fwd_intra",
            f"{_G}:chunk_gla_fwd_intra_gk",
            ("q", "k", "g"),
            ("A",),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_intra",
            kernels_jax=f"{_JAX}:chunk_gla_fwd_intra_gk",
            kwargs=(("scale", CASE_SCALE),),
        ),
        Stage(
            "gla",
            "fwd_o",
            f"{_G}:chunk_gla_fwd_o_gk",
            ("q", "v", "g", "A", "h"),
            ("o",),
            "fwd",
            oracle=f"{_ORACLE}:oracle_fwd_o",
            kernels_jax=f"{_JAX}:chunk_gla_fwd_o_gk",
            kwargs=(("scale", CASE_SCALE),),
            case_dtype=("h",),  # FLA's forward keeps the states in k's dtype (states_in_fp32=False)
        ),
        Stage(
            "gla",
            "bwd_dh",
            f"{_H}:chunk_bwd_dh",
            ("q", "k", "v", "do", "h0", "dht", "gk"),
            ("dh", "dh0"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dh",
            kernels_jax=f"{_JAX}:chunk_bwd_dh",
            kwargs=(("scale", CASE_SCALE), ("states_in_fp32", True)),
        ),
        Stage(
            "gla",
            "bwd_dv",
            f"{_G}:chunk_gla_bwd_dv",
            ("k", "g", "A", "do", "dh"),
            ("dv",),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dv",
            kernels_jax=f"{_JAX}:chunk_gla_bwd_dv",
        ),
        Stage(
            "gla",
            "bwd_dA",
            f"{_G}:chunk_gla_bwd_dA",
            ("v", "do"),
            ("dA",),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dA",
            kernels_jax=f"{_JAX}:chunk_gla_bwd_dA",
            kwargs=(("scale", CASE_SCALE),),
        ),
        Stage(
            "gla",
            "bwd_dqk_intra",
            f"{_G}:chunk_gla_bwd_dqk_intra",
            ("q", "k", "g", "dA"),
            ("dq", "dk"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dqk_intra",
            kernels_jax=f"{_JAX}:chunk_gla_bwd_dqk_intra",
        ),
        Stage(
            "gla",
            "bwd_dqkg",
            f"{_G}:chunk_gla_bwd_dqkg",
            ("q", "k", "v", "h", "g", "do", "dh", "dq", "dk"),
            ("dq", "dk", "dg"),
            "bwd",
            oracle=f"{_ORACLE}:oracle_bwd_dqkg",
            kernels_jax=f"{_JAX}:chunk_gla_bwd_dqkg",
            kwargs=(("scale", CASE_SCALE),),
        ),
    ),
    tensors=tensors,
    dtype=dtype,
    present=present,
    inputs=f"{_ORACLE}:stage_inputs",
    check=check,
    mask_undefined=mask_undefined,
)
