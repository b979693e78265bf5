"""Float64 oracle of GLA's chunk stages (FLA 0.6.0: fla.ops.gla.chunk, fla.ops.common.chunk_h,
fla.ops.utils.cumsum), and the stage inputs.

Every formula comes from the per-token recurrence, per sequence and head,
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t,   o_t = scale q_t S_t     (g_t [K] per channel),
regrouped by chunks of C tokens as FLA's stages regroup it. In a chunk (tokens i, j = 0..L, L the
last valid one; S = h the state before the chunk, dS = dh the gradient of the state after it),
with b2_i [K] the log2 gate cumsum from the chunk start as the stages receive it (the chunk-local
cumsum of the op's g times 1 / ln 2), and E_ij = exp2(b2_i - b2_j) [K] for j <= i:
    local_cumsum   g_cumsum_i = (g_0 + ... + g_i) / ln 2
    fwd_h          S_end = exp2(b2_L) * S + sum_j (exp2(b2_L - b2_j) * k_j)^T v_j   (* per key row)
    fwd_intra      A_ij = scale sum_k q_ik k_jk E_ijk for j <= i, else 0 (A [.., C]: column j)
    fwd_o          o_i = scale (q_i * exp2(b2_i)) S + sum_{j <= i} A_ij v_j
    bwd_dh         dS_prev = exp2(b2_L) * dS + scale sum_i (q_i * exp2(b2_i))^T do_i
    bwd_dv         dv_j = sum_{i >= j} A_ij do_i + (k_j * exp2(b2_L - b2_j)) dS
    bwd_dA         dA_ij = scale do_i . v_j for j <= i, else 0
    bwd_dqk_intra  dq_i = sum_{j <= i} dA_ij k_j * E_ij,  dk_j = sum_{i >= j} dA_ij q_i * E_ij
    bwd_dqkg       (dq, dk the intra parts above)
                   dq_i += scale exp2(b2_i) * (do_i S^T),  dk_j += exp2(b2_L - b2_j) * (v_j dS^T)
                   dg_t = sum_{u >= t in the chunk} (q_u * dq_u - k_u * dk_u)
                          + exp2(b2_L) * sum_V(S * dS) + sum_j k_j * (exp2(b2_L - b2_j) * v_j dS^T)
                   the gradient of the op's raw g [K] (FLA's kernel takes the reverse cumsum)
Only the entries j <= i of A and dA are read (FLA's kernels mask the rest). Chunks are cut per
row (B rows) or per packed sequence (cu_seqlens, B == 1), the last one of a sequence short;
states are indexed by chunk in FLA's order. Per-chunk loops in numpy float64, heads and
channels vectorised.
"""

from __future__ import annotations

import numpy as np

from cases.stages import RCP_LN2, stage_input_names
from references.stages.common import (
    as_states,
    cast_stage_inputs,
    chunks,
    flat_states,
    float64_tensors,
    local_cumsum,
    scan_states,
    tokens,
)

__all__ = ["RCP_LN2", "chunks", "local_cumsum", "stage_inputs"]

_OP_INPUTS = ("q", "k", "v", "do")  # passed as the op's own bytes


# ---------------------------------------------------------------- layout


def _lower(L: int) -> np.ndarray:
    """bool [L(i), L(j)]: j <= i."""
    return np.tril(np.ones((L, L), bool))


def _decays(b2: np.ndarray) -> np.ndarray:
    """E [H, L(i), L(j), K] = exp2(b2_i - b2_j) for j <= i, else 0 (never formed above the
    diagonal). b2 [L, H, K]."""
    low = _lower(b2.shape[0])[None, :, :, None]
    b = np.moveaxis(b2, 1, 0)  # [H, L, K]
    return np.exp2(np.where(low, b[:, :, None, :] - b[:, None, :, :], -np.inf))


def _square(case, M: np.ndarray, s: int, e: int, out: np.ndarray) -> None:
    """Writes a chunk's M [H, L(i), L(j)] into out [B * T, H, C] rows s..e-1, columns 0..L-1."""
    out[s:e, :, : e - s] = np.moveaxis(M, 0, 1)


def _chunk_square(x: np.ndarray, s: int, e: int) -> np.ndarray:
    """A chunk's [H, L(i), L(j)] of a flat x [B * T, H, C], masked to j <= i."""
    M = np.moveaxis(x[s:e, :, : e - s], 1, 0)
    return np.where(_lower(e - s)[None], M, 0.0)


# ---------------------------------------------------------------- stages (float64 in, float64 out)


def fwd_h(case, k, v, gk, h0=None) -> tuple[np.ndarray, np.ndarray]:
    """k, gk [B, T, H, K] (gk: log2 chunk-local cumsum), v [B, T, H, V], h0 [N, H, K, V] or None
    (0) -> h [B, NT, H, K, V] (the state before each chunk), ht [N, H, K, V]."""
    k, v, gate = tokens(k), tokens(v), tokens(gk)

    def step(c, s, e, S):
        b2 = gate[s:e]
        kd = k[s:e] * np.exp2(b2[-1] - b2)
        return np.exp2(b2[-1])[:, :, None] * S + np.einsum("jhk,jhv->hkv", kd, v[s:e])

    h, ht = scan_states(case, step, h0, (case.H, case.K, case.V))
    return as_states(case, h), ht


def fwd_intra(case, q, k, g) -> np.ndarray:
    """q, k, g [B, T, H, K] (g log2) -> A [B, T, H, C]: A_ij = scale sum_k q_ik k_jk E_ijk for
    j <= i (column j of row i's chunk), 0 elsewhere."""
    q, k, gate = tokens(q), tokens(k), tokens(g)
    A = np.zeros(q.shape[:2] + (case.chunk_size,))
    for _, s, e, _, _ in chunks(case):
        E = _decays(gate[s:e])
        M = case.scale_value * np.einsum("ihk,jhk,hijk->hij", q[s:e], k[s:e], E, optimize=True)
        _square(case, M, s, e, A)
    return A.reshape(case.B, case.T, case.H, case.chunk_size)


def fwd_o(case, q, v, g, A, h) -> np.ndarray:
    """q, g [B, T, H, K], v [B, T, H, V], A [B, T, H, C] (entries j <= i read), h [B, NT, H, K, V]
    -> o [B, T, H, V]."""
    q, v, gate, A = tokens(q), tokens(v), tokens(g), tokens(A)
    h = flat_states(h)
    o = np.empty_like(v)
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        inter = case.scale_value * np.einsum("ihk,hkv->ihv", q[s:e] * np.exp2(gate[s:e]), h[c])
        o[s:e] = inter + np.einsum("hij,jhv->ihv", _chunk_square(A, s, e), v[s:e])
    return o.reshape(case.B, case.T, case.H, case.V)


def bwd_dh(case, q, do, gk, dht=None) -> tuple[np.ndarray, np.ndarray]:
    """q, gk [B, T, H, K], do [B, T, H, V], dht [N, H, K, V] or None (0) -> dh [B, NT, H, K, V]
    (the gradient of the state after each chunk), dh0 [N, H, K, V]."""
    q, do, gate = tokens(q), tokens(do), tokens(gk)

    def step(c, s, e, dS):
        b2 = gate[s:e]
        qd = case.scale_value * q[s:e] * np.exp2(b2)
        return np.exp2(b2[-1])[:, :, None] * dS + np.einsum("ihk,ihv->hkv", qd, do[s:e])

    dh, dh0 = scan_states(case, step, dht, (case.H, case.K, case.V), reverse=True)
    return as_states(case, dh), dh0


def bwd_dv(case, k, g, A, do, dh) -> np.ndarray:
    """k, g [B, T, H, K], A [B, T, H, C], do [B, T, H, V], dh [B, NT, H, K, V] -> dv [B, T, H, V]."""
    k, gate, A, do = tokens(k), tokens(g), tokens(A), tokens(do)
    dh = flat_states(dh)
    dv = np.empty_like(do)
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        b2 = gate[s:e]
        kd = k[s:e] * np.exp2(b2[-1] - b2)
        dv[s:e] = np.einsum("hij,ihv->jhv", _chunk_square(A, s, e), do[s:e]) + np.einsum("jhk,hkv->jhv", kd, dh[c])
    return dv.reshape(case.B, case.T, case.H, case.V)


def bwd_dA(case, v, do) -> np.ndarray:
    """v, do [B, T, H, V] -> dA [B, T, H, C]: scale do_i . v_j for j <= i, else 0."""
    v, do = tokens(v), tokens(do)
    dA = np.zeros(v.shape[:2] + (case.chunk_size,))
    for _, s, e, _, _ in chunks(case):
        M = case.scale_value * np.einsum("ihv,jhv->hij", do[s:e], v[s:e])
        _square(case, np.where(_lower(e - s)[None], M, 0.0), s, e, dA)
    return dA.reshape(case.B, case.T, case.H, case.chunk_size)


def bwd_dqk_intra(case, q, k, g, dA) -> tuple[np.ndarray, np.ndarray]:
    """q, k, g [B, T, H, K], dA [B, T, H, C] (entries j <= i read) -> dq, dk [B, T, H, K]: the
    gradients of q, k through A."""
    q, k, gate, dA = tokens(q), tokens(k), tokens(g), tokens(dA)
    dq, dk = np.empty_like(q), np.empty_like(k)
    for _, s, e, _, _ in chunks(case):
        W = _chunk_square(dA, s, e)[..., None] * _decays(gate[s:e])  # [H, i, j, K]
        dq[s:e] = np.einsum("hijk,jhk->ihk", W, k[s:e])
        dk[s:e] = np.einsum("hijk,ihk->jhk", W, q[s:e])
    shape = (case.B, case.T, case.H, case.K)
    return dq.reshape(shape), dk.reshape(shape)


def bwd_dqkg(case, q, k, v, h, g, do, dh, dq, dk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, g [B, T, H, K], v, do [B, T, H, V], h, dh [B, NT, H, K, V], dq, dk [B, T, H, K] (the
    intra parts, bwd_dqk_intra's) -> dq, dk [B, T, H, K] (whole), dg [B, T, H, K] (the gradient
    of the op's raw g)."""
    q, k, v, do, gate = tokens(q), tokens(k), tokens(v), tokens(do), tokens(g)
    dq, dk = tokens(dq).copy(), tokens(dk).copy()
    h, dh = flat_states(h), flat_states(dh)
    dg = np.empty_like(q)
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        b2 = gate[s:e]
        dq[s:e] += case.scale_value * np.exp2(b2) * np.einsum("ihv,hkv->ihk", do[s:e], h[c])
        dk_state = np.exp2(b2[-1] - b2) * np.einsum("jhv,hkv->jhk", v[s:e], dh[c])
        dk[s:e] += dk_state
        dgk = np.exp2(b2[-1]) * np.einsum("hkv,hkv->hk", h[c], dh[c]) + np.sum(dk_state * k[s:e], axis=0)
        terms = q[s:e] * dq[s:e] - k[s:e] * dk[s:e]
        dg[s:e] = np.flip(np.cumsum(np.flip(terms, 0), 0), 0) + dgk
    shape = (case.B, case.T, case.H, case.K)
    return dq.reshape(shape), dk.reshape(shape), dg.reshape(shape)


# ---------------------------------------------------------------- the stage case


def oracle_fwd_h(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_fwd_h's outputs on its float64 inputs `x` (cases/stages/gla.py)."""
    h, ht = fwd_h(case, x["k"], x["v"], x["gk"], x.get("h0"))
    return {"h": h, "ht": ht}


def oracle_fwd_intra(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gla_fwd_intra_gk's outputs on its float64 inputs `x`."""
    return {"A": fwd_intra(case, x["q"], x["k"], x["g"])}


def oracle_fwd_o(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gla_fwd_o_gk's outputs on its float64 inputs `x`."""
    return {"o": fwd_o(case, x["q"], x["v"], x["g"], x["A"], x["h"])}


def oracle_bwd_dh(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_bwd_dh's outputs on its float64 inputs `x`."""
    dh, dh0 = bwd_dh(case, x["q"], x["do"], x["gk"], x.get("dht"))
    return {"dh": dh, "dh0": dh0}


def oracle_bwd_dv(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gla_bwd_dv's outputs on its float64 inputs `x`."""
    return {"dv": bwd_dv(case, x["k"], x["g"], x["A"], x["do"], x["dh"])}


def oracle_bwd_dA(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gla_bwd_dA's outputs on its float64 inputs `x`."""
    return {"dA": bwd_dA(case, x["v"], x["do"])}


def oracle_bwd_dqk_intra(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gla_bwd_dqk_intra's outputs on its float64 inputs `x`."""
    dq, dk = bwd_dqk_intra(case, x["q"], x["k"], x["g"], x["dA"])
    return {"dq": dq, "dk": dk}


def oracle_bwd_dqkg(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gla_bwd_dqkg's outputs on its float64 inputs `x`."""
    dq, dk, dg = bwd_dqkg(case, x["q"], x["k"], x["v"], x["h"], x["g"], x["do"], x["dh"], x["dq"], x["dk"])
    return {"dq": dq, "dk": dk, "dg": dg}


def stage_inputs_f64(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage's inputs (cases.stages.stage_input_names) in float64, before their cast, from the op's
    inputs (cases.make_inputs(case.op_case)) upcast to float64: q, k, v, do, g (local_cumsum)
    as they are; h0 = initial_state; dht; g, gk the log2 chunk-local cumsum of the op's g;
    A, h, dh, dA and the intra dq, dk the upstream stages' outputs, from those."""
    x = float64_tensors(op_inputs)
    st = case.stage
    gate = x["g"] if st == "local_cumsum" else local_cumsum(case, x["g"])
    h0, dht = x.get("initial_state") if case.h0 else None, x.get("dht") if case.ht else None
    lazy = {
        "g": lambda: gate,
        "gk": lambda: gate,
        "h0": lambda: h0,
        "dht": lambda: dht,
        "A": lambda: fwd_intra(case, x["q"], x["k"], gate),
        "h": lambda: fwd_h(case, x["k"], x["v"], gate, h0)[0],
        "dh": lambda: bwd_dh(case, x["q"], x["do"], gate, dht)[0],
        "dA": lambda: bwd_dA(case, x["v"], x["do"]),
    }
    names = stage_input_names(case)
    out = {}
    for n in names:
        if n in ("dq", "dk"):
            if "dq" not in out:
                out["dq"], out["dk"] = bwd_dqk_intra(case, x["q"], x["k"], gate, bwd_dA(case, x["v"], x["do"]))
        else:
            out[n] = lazy[n]() if n in lazy else x[n]
    return {n: out[n] for n in names}


def stage_inputs(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage's inputs (cases.stages.stage_input_names, plus cu_seqlens int64 [N + 1] for varlen), each in
    its stage dtype: q, k, v, do exactly the op's; the rest computed in float64
    (stage_inputs_f64) and rounded once."""
    f64 = stage_inputs_f64(case, op_inputs)
    return cast_stage_inputs(case, f64, {n: op_inputs[n] for n in f64 if n in _OP_INPUTS})
