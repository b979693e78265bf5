"""Float64 oracle of GDN's chunk stages (FLA 0.6.0: fla.ops.gated_delta_rule, fla.ops.common
.chunk_delta_h, .chunk_o, fla.ops.utils.cumsum; see cases/stages/gdn.py), and the stage inputs.

Every formula comes from the per-token recurrence (references/gdn.py), per sequence and value head,
    S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t,   o_t = scale q_t S_t,
regrouped by chunks of C tokens as FLA's stages regroup it (its WY form). In a chunk (tokens
i = 0..L, L the last valid one; S = h the state before the chunk, dS = dh the gradient of the
state after it), with b2_i the log2 gate cumsum from the chunk start as the stages receive it,
E_ij = exp2(b2_i - b2_j) and D_ij = E_ij for j <= i, else 0:
    local_cumsum   g_cumsum_i = (g_0 + ... + g_i) / ln 2
    fwd_intra      M_ij = beta_i (k_i . k_j) E_ij (j < i), A = (I + M)^-1,
                   w = A X with X_j = beta_j exp2(b2_j) k_j, u = A Y with Y_j = beta_j v_j
    fwd_h          v_new = u - w S;  S_end = exp2(b2_L) S + sum_j exp2(b2_L - b2_j) k_j^T v_new_j
    fwd_o          o_i = scale (exp2(b2_i) q_i S + sum_j D_ij (q_i . k_j) v_new_j)
    bwd_dv_local   dv_j = scale sum_i D_ij (q_i . k_j) do_i
    bwd_dhu        dv2_j = dv_j + exp2(b2_L - b2_j) k_j dS
                   dS_prev = exp2(b2_L) dS + scale sum_i exp2(b2_i) q_i^T do_i - sum_i w_i^T dv2_i;
                   dh = the dS after each chunk (dht, or 0, after a sequence's last), dh0 = dS_prev
                   of each sequence's first
    bwd_dqkwg      Simple GLA's chunk_bwd_dqkwg with v = v_new (references/stages/simple_gla.py:
                   dq, dk and dg w.r.t. the natural-log cumsum), and dw = -dv2 S^T (dv = dv2)
    bwd_wy         the gradient of <dw, w> + <du, u> through fwd_intra's w = A X, u = A Y at the
                   given A, A = (I + M)^-1 (dM = -A^T dA A^T on the strict lower triangle):
                   dk2 (through X and M), dv = beta A^T du, db, and dg2 w.r.t. the natural-log cumsum
                   (through exp2(b2) in X and E in M)
Grouped value heads (HV = G * H): value head j reads q, k head j // G; dq, dk, dk2 are summed over
the G value heads of each q, k head, as FLA sums them. Chunks are cut per row (B rows) or per
packed sequence (cu_seqlens, B == 1), the last one of a sequence short; states are indexed by
chunk in FLA's order. Per-chunk loops in numpy float64, heads vectorised.
"""

from __future__ import annotations

import numpy as np

from cases.inputs import STORAGE_DTYPES as NP_DTYPES
from cases.stages import RCP_LN2, stage_input_names
from references.stages.common import (
    as_states,
    cast_stage_inputs,
    causal_decays,
    chunks,
    flat_states,
    float64_tensors,
    local_cumsum,
    scan_states,
    tokens,
    unflatten_tokens,
    value_heads,
)

__all__ = ["NP_DTYPES", "RCP_LN2", "chunks", "local_cumsum", "stage_inputs"]

# ---------------------------------------------------------------- layout


def _group_sum(case, x: np.ndarray) -> np.ndarray:
    """[B * T, HV, K] -> [B, T, H, K]: the sum over each q, k head's G value heads."""
    return x.reshape(case.B, case.T, case.H, case.G, x.shape[-1]).sum(3)


def _state_shape(case) -> tuple[int, int, int]:
    """One state's shape (HV, K, V)."""
    return (case.value_heads, case.K, case.V)


def _unit_lower_inverse(M: np.ndarray) -> np.ndarray:
    """(I + M)^-1 for M [.., L, L] strictly lower, by forward substitution."""
    L = M.shape[-1]
    X = np.zeros(M.shape)
    for i in range(L):
        X[..., i, :i] = -(M[..., i : i + 1, :i] @ X[..., :i, :i])[..., 0, :]
        X[..., i, i] = 1.0
    return X


def _chunk_A(A: np.ndarray, s: int, e: int) -> np.ndarray:
    """The stored A [B * T, HV, C] of tokens s..e-1 -> [HV, L, L] (row: token, column: position)."""
    return np.moveaxis(A[s:e, :, : e - s], 1, 0)


# ---------------------------------------------------------------- stages (float64 in, float64 out)


def _w_u(A, kc, vc, beta, b2):
    """w [L, HV, K], u [L, HV, V] = A (beta exp2(b2) k), A (beta v); A [HV, L, L]."""
    X = kc * (beta * np.exp2(b2))[:, :, None]
    Y = vc * beta[:, :, None]
    return np.einsum("hij,jhk->ihk", A, X), np.einsum("hij,jhv->ihv", A, Y)


def fwd_intra(case, k, v, g, beta) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k [B, T, H, K], v [B, T, HV, V], g (log2 cumsum), beta [B, T, HV] ->
    w [B, T, HV, K], u [B, T, HV, V], A [B, T, HV, C] (zero past a short chunk's end)."""
    k, v, g, beta = value_heads(case, k), tokens(v), tokens(g), tokens(beta)
    w, u = np.empty(k.shape), np.empty(v.shape)
    A = np.zeros(g.shape + (case.chunk_size,))
    for _, s, e, _, _ in chunks(case):
        M = np.einsum("ihk,jhk->hij", k[s:e], k[s:e]) * beta[s:e].T[:, :, None] * causal_decays(g[s:e], strict=True)
        Ac = _unit_lower_inverse(M)
        A[s:e, :, : e - s] = np.moveaxis(Ac, 0, 1)
        w[s:e], u[s:e] = _w_u(Ac, k[s:e], v[s:e], beta[s:e], g[s:e])
    return unflatten_tokens(case, w), unflatten_tokens(case, u), unflatten_tokens(case, A)


def fwd_h(case, k, w, u, g, h0=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k [B, T, H, K], w [B, T, HV, K], u [B, T, HV, V], g (log2 cumsum), h0 [N, HV, K, V] or None ->
    h [B, NT, HV, K, V] (the state before each chunk), v_new [B, T, HV, V], ht [N, HV, K, V]."""
    k, w, u, g = value_heads(case, k), tokens(w), tokens(u), tokens(g)
    v_new = np.empty(u.shape)

    def step(c, s, e, S):
        b2 = g[s:e]
        v_new[s:e] = u[s:e] - np.einsum("ihk,hkv->ihv", w[s:e], S)
        kd = k[s:e] * np.exp2(b2[-1] - b2)[:, :, None]
        return np.exp2(b2[-1])[:, None, None] * S + np.einsum("jhk,jhv->hkv", kd, v_new[s:e])

    h, ht = scan_states(case, step, h0, _state_shape(case))
    return as_states(case, h), unflatten_tokens(case, v_new), ht


def fwd_o(case, q, k, v, h, g) -> np.ndarray:
    """q, k [B, T, H, K], v (v_new) [B, T, HV, V], h [B, NT, HV, K, V], g (log2) -> o [B, T, HV, V]."""
    q, k, v, g, h = value_heads(case, q), value_heads(case, k), tokens(v), tokens(g), flat_states(h)
    o = np.empty(v.shape)
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        b2 = g[s:e]
        P = np.einsum("ihk,jhk->hij", q[s:e], k[s:e]) * causal_decays(b2)
        inter = np.exp2(b2)[:, :, None] * np.einsum("ihk,hkv->ihv", q[s:e], h[c])
        o[s:e] = case.scale_value * (inter + np.einsum("hij,jhv->ihv", P, v[s:e]))
    return unflatten_tokens(case, o)


def bwd_dv_local(case, q, k, do, g) -> np.ndarray:
    """q, k [B, T, H, K], do [B, T, HV, V], g (log2) -> dv [B, T, HV, V] (o's share, in the chunk)."""
    q, k, do, g = value_heads(case, q), value_heads(case, k), tokens(do), tokens(g)
    dv = np.empty(do.shape)
    for _, s, e, _, _ in chunks(case):
        P = case.scale_value * np.einsum("ihk,jhk->hij", q[s:e], k[s:e]) * causal_decays(g[s:e])
        dv[s:e] = np.einsum("hij,ihv->jhv", P, do[s:e])
    return unflatten_tokens(case, dv)


def bwd_dhu(case, q, k, w, do, dv, g, dht=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k [B, T, H, K], w [B, T, HV, K], do, dv [B, T, HV, V], g (log2), dht [N, HV, K, V] or None
    -> dh [B, NT, HV, K, V] (the gradient of the state after each chunk), dh0 [N, HV, K, V],
    dv2 [B, T, HV, V]."""
    q, k, w, do, dv, g = value_heads(case, q), value_heads(case, k), tokens(w), tokens(do), tokens(dv), tokens(g)
    dv2 = np.empty(dv.shape)

    def step(c, s, e, dS):
        b2 = g[s:e]
        kd = k[s:e] * np.exp2(b2[-1] - b2)[:, :, None]
        dv2[s:e] = dv[s:e] + np.einsum("jhk,hkv->jhv", kd, dS)
        qd = case.scale_value * q[s:e] * np.exp2(b2)[:, :, None]
        return (
            np.exp2(b2[-1])[:, None, None] * dS
            + np.einsum("ihk,ihv->hkv", qd, do[s:e])
            - np.einsum("ihk,ihv->hkv", w[s:e], dv2[s:e])
        )

    dh, dh0 = scan_states(case, step, dht, _state_shape(case), reverse=True)
    return as_states(case, dh), dh0, unflatten_tokens(case, dv2)


def bwd_dqkwg(case, q, k, v, do, h, dh, w, g, dv) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q, k [B, T, H, K], v (v_new), do, dv (dv2) [B, T, HV, V], h, dh [B, NT, HV, K, V], g (log2)
    -> dq, dk [B, T, H, K], dw [B, T, HV, K], dg [B, T, HV] (w.r.t. the natural-log cumsum; the
    diagonal pairs, which cancel, left out as in references/stages/simple_gla.py)."""
    q, k, v, do, g, dv = value_heads(case, q), value_heads(case, k), tokens(v), tokens(do), tokens(g), tokens(dv)
    h, dh = flat_states(h), flat_states(dh)
    dq, dk, dw, dg = np.empty(q.shape), np.empty(k.shape), np.empty(q.shape), np.empty(g.shape)
    scale = case.scale_value
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        qc, kc, vc, doc = q[s:e], k[s:e], v[s:e], do[s:e]
        b2 = g[s:e]
        ds = scale * np.einsum("ihv,jhv->hij", doc, vc) * causal_decays(b2)
        dq_state = scale * np.exp2(b2)[:, :, None] * np.einsum("ihv,hkv->ihk", doc, h[c])
        dk_state = np.exp2(b2[-1] - b2)[:, :, None] * np.einsum("jhv,hkv->jhk", vc, dh[c])
        dq[s:e] = dq_state + np.einsum("hij,jhk->ihk", ds, kc)
        dk[s:e] = dk_state + np.einsum("hij,ihk->jhk", ds, qc)
        dw[s:e] = -np.einsum("jhv,hkv->jhk", dv[s:e], h[c])
        M = np.tril(ds * np.einsum("ihk,jhk->hij", qc, kc), -1)
        wt = np.einsum("jhk,jhk->jh", kc, dk_state)
        g_t = np.einsum("ihk,ihk->ih", qc, dq_state) + M.sum(2).T - M.sum(1).T - wt
        g_t[-1] += np.exp2(b2[-1]) * np.einsum("hkv,hkv->h", h[c], dh[c]) + wt.sum(0)
        dg[s:e] = g_t
    return _group_sum(case, dq), _group_sum(case, dk), unflatten_tokens(case, dw), unflatten_tokens(case, dg)


def bwd_wy(case, k, v, beta, A, dw, du, g) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """k [B, T, H, K], v, du [B, T, HV, V], beta [B, T, HV], A [B, T, HV, C], dw [B, T, HV, K],
    g (log2) -> dk2 [B, T, H, K], dv [B, T, HV, V], db [B, T, HV], dg2 [B, T, HV] (w.r.t. the
    natural-log cumsum): the gradients of <dw, w> + <du, u>, w = A X, u = A Y, at the given A."""
    k, v, beta, A, g = value_heads(case, k), tokens(v), tokens(beta), tokens(A), tokens(g)
    dw, du = tokens(dw), tokens(du)
    dk, dv, db, dg = np.empty(k.shape), np.empty(v.shape), np.empty(beta.shape), np.empty(g.shape)
    for _, s, e, _, _ in chunks(case):
        kc, vc, bc, b2 = k[s:e], v[s:e], beta[s:e], g[s:e]
        Ac = _chunk_A(A, s, e)  # [HV, L, L]
        eb = np.exp2(b2)
        X = kc * (bc * eb)[:, :, None]
        Y = vc * bc[:, :, None]
        dX = np.einsum("hij,ihk->jhk", Ac, dw[s:e])  # A^T dw
        dY = np.einsum("hij,ihv->jhv", Ac, du[s:e])
        dA = np.einsum("ihk,jhk->hij", dw[s:e], X) + np.einsum("ihv,jhv->hij", du[s:e], Y)
        dA = np.tril(dA, -1)
        # dM = -A^T dA A^T on the strict lower triangle; M_ij = beta_i (k_i . k_j) E_ij
        dM = -np.tril(np.swapaxes(Ac, 1, 2) @ dA @ np.swapaxes(Ac, 1, 2), -1)
        E = causal_decays(b2, strict=True)
        kk = np.einsum("ihk,jhk->hij", kc, kc)
        dKb = dM * E  # gradient of beta_i (k_i . k_j)
        Mv = dKb * kk * bc.T[:, :, None]  # dM_ij M_ij: the gate's share of each pair
        dk[s:e] = (
            dX * (bc * eb)[:, :, None]
            + np.einsum("hij,jhk->ihk", dKb * bc.T[:, :, None], kc)
            + np.einsum("hij,ihk->jhk", dKb * bc.T[:, :, None], kc)
        )
        dv[s:e] = dY * bc[:, :, None]
        db[s:e] = (
            np.einsum("ihk,ihk->ih", dX, kc) * eb + np.einsum("ihv,ihv->ih", dY, vc) + np.einsum("hij,hij->ih", dKb, kk)
        )
        dg[s:e] = np.einsum("ihk,ihk->ih", dX, X) + Mv.sum(2).T - Mv.sum(1).T
    return _group_sum(case, dk), unflatten_tokens(case, dv), unflatten_tokens(case, db), unflatten_tokens(case, dg)


# ---------------------------------------------------------------- the stage case


def oracle_fwd_intra(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gated_delta_rule_fwd_intra's outputs on its float64 inputs `x` (cases/stages/gdn.py)."""
    return dict(zip(("w", "u", "A"), fwd_intra(case, x["k"], x["v"], x["g"], x["beta"])))


def oracle_fwd_h(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gated_delta_rule_fwd_h's outputs on its float64 inputs `x`."""
    return dict(zip(("h", "v_new", "ht"), fwd_h(case, x["k"], x["w"], x["u"], x["g"], x.get("initial_state"))))


def oracle_fwd_o(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_fwd_o's outputs on its float64 inputs `x`."""
    return {"o": fwd_o(case, x["q"], x["k"], x["v"], x["h"], x["g"])}


def oracle_bwd_dv_local(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_bwd_dv_local's outputs on its float64 inputs `x`."""
    return {"dv": bwd_dv_local(case, x["q"], x["k"], x["do"], x["g"])}


def oracle_bwd_dhu(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gated_delta_rule_bwd_dhu's outputs on its float64 inputs `x`."""
    got = bwd_dhu(case, x["q"], x["k"], x["w"], x["do"], x["dv"], x["g"], x.get("dht"))
    return dict(zip(("dh", "dh0", "dv2"), got))


def oracle_bwd_dqkwg(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_bwd_dqkwg's outputs on its float64 inputs `x`."""
    got = bwd_dqkwg(case, x["q"], x["k"], x["v"], x["do"], x["h"], x["dh"], x["w"], x["g"], x["dv"])
    return dict(zip(("dq", "dk", "dw", "dg"), got))


def oracle_bwd_wy(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """prepare_wy_repr_bwd's outputs on its float64 inputs `x`."""
    got = bwd_wy(case, x["k"], x["v"], x["beta"], x["A"], x["dw"], x["du"], x["g"])
    return dict(zip(("dk2", "dv", "db", "dg2"), got))


def intermediates(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor a gdn stage may take, in float64, from the op's inputs (upcast): the op's own
    (q, k, v, beta, do, initial_state, dht; g raw for local_cumsum), g_log2 (the log2 chunk-local
    cumsum), the forward's w, u, A, h, v_new, and the backward's dv (bwd_dv_local), dh, dv2
    (bwd_dhu) and dw (bwd_dqkwg), each computed by the stages above from the float64 values
    before it."""
    x = float64_tensors(op_inputs)
    g2 = local_cumsum(case, x["g"])
    h0 = x.get("initial_state") if case.h0 else None
    w, u, A = fwd_intra(case, x["k"], x["v"], g2, x["beta"])
    h, v_new, _ = fwd_h(case, x["k"], w, u, g2, h0)
    out = {**x, "g_log2": g2, "w": w, "u": u, "A": A, "h": h, "v_new": v_new}
    if "do" in x:
        dv = bwd_dv_local(case, x["q"], x["k"], x["do"], g2)
        dh, _, dv2 = bwd_dhu(case, x["q"], x["k"], w, x["do"], dv, g2, x.get("dht") if case.ht else None)
        _, _, dw, _ = bwd_dqkwg(case, x["q"], x["k"], v_new, x["do"], h, dh, w, g2, dv2)
        out.update(dv_local=dv, dh=dh, dv2=dv2, dw=dw)
    return out


def stage_inputs_f64(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage's inputs (stage_input_names(case)) in float64, before their cast (see intermediates):
    g is the raw g for local_cumsum, the log2 cumsum elsewhere; v is v_new for fwd_o and bwd_dqkwg;
    dv is bwd_dv_local's for bwd_dhu and dv2 for bwd_dqkwg; du is dv2; initial_state and h0 the
    op's initial state."""
    x = intermediates(case, op_inputs)
    st = case.stage
    alias = {"g": "g" if st == "local_cumsum" else "g_log2", "h0": "initial_state", "du": "dv2"}
    if st in ("fwd_o", "bwd_dqkwg"):
        alias["v"] = "v_new"
    alias["dv"] = "dv2" if st == "bwd_dqkwg" else "dv_local"
    return {n: x[alias.get(n, n)] for n in stage_input_names(case)}


def stage_inputs(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage's inputs (stage_input_names(case), plus cu_seqlens int64 [N + 1] for varlen), each in
    its stage dtype: the op's own inputs exactly (q, k, v, beta, do, the raw g, initial_state,
    dht); the rest computed in float64 (stage_inputs_f64) and rounded once."""
    own = {"q", "k", "beta", "do", "dht", "initial_state"}
    if case.stage == "local_cumsum":
        own.add("g")
    if case.stage not in ("fwd_o", "bwd_dqkwg"):
        own.add("v")
    f64 = stage_inputs_f64(case, op_inputs)
    src = {n: "initial_state" if n == "h0" else n for n in f64}
    return cast_stage_inputs(case, f64, {n: op_inputs[src[n]] for n in f64 if src[n] in own})
