"""Float64 oracle of KDA's chunk stages (FLA 0.6.0: fla.ops.kda.chunk_intra, chunk_bwd,
fla.ops.common.chunk_delta_h, fla.ops.gla.chunk, fla.ops.utils.cumsum), and the stage inputs.

Every formula comes from the per-token recurrence (references/kda.py), per sequence and value
head, S' = diag(exp(g_t)) S_{t-1}, S_t = S' + beta_t k_t^T (v_t - k_t S'), o_t = scale q_t S_t,
regrouped by chunks of C tokens as FLA's stages regroup it (the WY form). In a chunk (tokens
i, j = 0..L-1; S = h the state before it; dS = dh the gradient of the state after it), with
G_i [K] the log2 gate cumsum from the chunk start (gk: the chunk-local cumsum of the op's g times
1 / ln 2), E_ij = exp2(G_i - G_j) per channel, <x, y>_E = sum_c x_c y_c E_ij[c], and q, k the q, k
head of the value head:
    local_cumsum  g_cumsum_i = (g_0 + ... + g_i) / ln 2
    fwd_intra     Aqk_ij = scale <q_i, k_j>_E (j <= i), M_ij = beta_i <k_i, k_j>_E (j < i),
                  Akk = (I + M)^-1, w = Akk (beta k exp2(G)), u = Akk (beta v), kg = k exp2(G_L - G)
    fwd_h         v_new = u - w S;  S_end = exp2(G_L) S + kg^T v_new  (h = S per chunk, ht)
    fwd_o         o = scale (q exp2(G)) S + tril(A) v_new
    bwd_dAv       dAqk_ij = scale do_i . v_new_j (j <= i);  dv = tril(A)^T do
    bwd_dhu       dv' = dv + kg dS;  dS_prev = exp2(G_L) dS + scale qg^T do - w^T dv'
                  (dh = dS per chunk, dh0 = dS_prev of each sequence's first chunk)
    bwd_wy        (FLA's fused kernel: the state parts of dq, dk, dg and the WY gradients)
                  dq = scale exp2(G) (do h^T);  dk_s = exp2(G_L - G) (v_new dh^T);  dw = -dv h^T
                  kb = k exp2(G);  dx = Akk^T dw;  du = Akk^T dv
                  dv_out = beta du;  db = rowsum(du v) + rowsum(dx kb)
                  dk = dk_s + beta exp2(G) dx;  dg = q dq - k dk_s + beta kb dx
                       + [i = L-1] (exp2(G_L) sum_v h dh + sum_t k_t dk_s_t)
                  dAkk = -(Akk^T P Akk^T) on j < i, with P_ij = beta_j (dv_i . v_j + dw_i . kb_j) (j < i)
    bwd_intra     dq += sum_{j<=i} dAqk_ij k_j E_ij;  X_i = sum_{j<=i} dAkk_ij k_j E_ij
                  db += rowsum(X k);  Y_j = sum_{i>=j} (dAqk_ij q_i + dAkk_ij beta_i k_i) E_ij
                  dk += beta X + Y;  dg += q (dq part) + (beta X - Y) k
The stages' dg is the gradient w.r.t. the natural-log chunk-local cumsum (FLA's exp2 of log2
units cancels the ln 2); FLA's op takes its reverse chunk-local cumsum as the gradient of g.
Chunks are cut per row (B rows) or per packed sequence (cu_seqlens, B == 1) as in
references/stages/simple_gla.py; per-chunk loops in numpy float64, value heads vectorised; the
decays E are applied factored when a chunk's gate range allows it (`_Decays`).
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
    unflatten_tokens,
    value_heads,
)

__all__ = ["RCP_LN2", "chunks", "local_cumsum", "stage_inputs"]

# ---------------------------------------------------------------- layout


SPLIT_LIMIT = 900.0  # log2 units: below it exp2(G_i - G_0) and exp2(G_0 - G_j) stay normal float64


class _Decays:
    """The decays E_ij = exp2(G_i - G_j) (j <= i, per channel) of one chunk, G [L, HV, K], applied
    without forming E when the chunk's gate range is under SPLIT_LIMIT: E_ij = a_i b_j with
    a = exp2(G - G_0), b = exp2(G_0 - G), both normal float64 numbers (products accurate to a few
    ulp); otherwise E [HV, L, L, K] with the exponent masked before exp2 (never overflows)."""

    def __init__(self, G: np.ndarray):
        L = G.shape[0]
        self.low = np.tril(np.ones((L, L)))
        rng = np.max(np.abs(G - G[:1])) if L else 0.0
        if rng < SPLIT_LIMIT:
            self.a, self.b, self.E = np.exp2(G - G[:1]), np.exp2(G[:1] - G), None
        else:
            Gt = G.transpose(1, 0, 2)
            mask = self.low.astype(bool)[None, :, :, None]
            self.E = np.exp2(np.where(mask, Gt[:, :, None, :] - Gt[:, None, :, :], -np.inf))

    def pairs(self, x, y) -> np.ndarray:
        """P [HV, L(i), L(j)] = sum_c x_i y_j E_ij for j <= i, else 0. x, y [L, HV, K]."""
        if self.E is not None:
            return np.einsum("ihc,jhc,hijc->hij", x, y, self.E, optimize=True)
        return np.einsum("ihc,jhc->hij", x * self.a, y * self.b) * self.low

    def rows(self, P, y) -> np.ndarray:
        """Z_i = sum_{j <= i} P_ij y_j E_ij [L, HV, K]. P [HV, L, L]; y [L, HV, K]."""
        if self.E is not None:
            return np.einsum("hij,jhc,hijc->ihc", P * self.low, y, self.E, optimize=True)
        return self.a * np.einsum("hij,jhc->ihc", P * self.low, y * self.b)

    def cols(self, P, x) -> np.ndarray:
        """Y_j = sum_{i >= j} P_ij x_i E_ij [L, HV, K]. P [HV, L, L]; x [L, HV, K]."""
        if self.E is not None:
            return np.einsum("hij,ihc,hijc->jhc", P * self.low, x, self.E, optimize=True)
        return self.b * np.einsum("hij,ihc->jhc", P * self.low, x * self.a)


def _chunk_matrix(A: np.ndarray, s: int, e: int, strict: bool = False) -> np.ndarray:
    """A [B * T, HV, C] (row t: its chunk's columns) -> [HV, L(i), L(j)], lower triangular
    (with the diagonal unless strict): the part FLA's kernels read."""
    L = e - s
    M = A[s:e, :, :L].transpose(1, 0, 2)
    return M * np.tril(np.ones((L, L)), -1 if strict else 0)


def _put_matrix(out: np.ndarray, M: np.ndarray, s: int, e: int) -> None:
    """M [HV, L(i), L(j)] -> out[s:e, :, :L] of a [B * T, HV, C] array."""
    out[s:e, :, : e - s] = M.transpose(1, 0, 2)


# ---------------------------------------------------------------- stages (float64 in, float64 out)


def fwd_intra(case, q, k, v, gk, beta) -> dict[str, np.ndarray]:
    """q, k [B, T, H, K], v [B, T, HV, V], gk [B, T, HV, K] (log2 cumsum), beta [B, T, HV] ->
    w, kg [B, T, HV, K], u [B, T, HV, V], Aqk, Akk [B, T, HV, C] (0 outside the lower triangle)."""
    q, k, v, G, b = value_heads(case, q), value_heads(case, k), tokens(v), tokens(gk), tokens(beta)
    HV, C = G.shape[1], case.chunk_size
    w, kg, u = np.empty_like(G), np.empty_like(G), np.empty_like(v)
    Aqk, Akk = np.zeros((G.shape[0], HV, C)), np.zeros((G.shape[0], HV, C))
    for _, s, e, _, _ in chunks(case):
        L, Gc, kc, bc = e - s, G[s:e], k[s:e], b[s:e]
        D = _Decays(Gc)
        _put_matrix(Aqk, case.scale_value * D.pairs(q[s:e], kc), s, e)
        M = D.pairs(kc, kc) * bc.T[:, :, None] * np.tril(np.ones((L, L)), -1)
        inv = np.linalg.inv(np.eye(L)[None] + M)
        _put_matrix(Akk, inv, s, e)
        w[s:e] = np.einsum("hij,jhc->ihc", inv, kc * bc[:, :, None] * np.exp2(Gc))
        u[s:e] = np.einsum("hij,jhv->ihv", inv, v[s:e] * bc[:, :, None])
        kg[s:e] = kc * np.exp2(Gc[-1] - Gc)
    return {
        "w": unflatten_tokens(case, w),
        "u": unflatten_tokens(case, u),
        "kg": unflatten_tokens(case, kg),
        "Aqk": unflatten_tokens(case, Aqk),
        "Akk": unflatten_tokens(case, Akk),
    }


def fwd_h(case, kg, w, u, gk, h0=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """kg, w [B, T, HV, K], u [B, T, HV, V], gk (log2 cumsum), h0 [N, HV, K, V] or None (0) ->
    h [B, NT, HV, K, V] (the state before each chunk), v_new [B, T, HV, V], ht [N, HV, K, V]."""
    kg, w, u, G = tokens(kg), tokens(w), tokens(u), tokens(gk)
    HV, K, V = G.shape[1], G.shape[2], u.shape[2]
    v_new = np.empty_like(u)

    def step(c, s, e, S):
        vn = u[s:e] - np.einsum("jhk,hkv->jhv", w[s:e], S)
        v_new[s:e] = vn
        return np.exp2(G[e - 1])[:, :, None] * S + np.einsum("jhk,jhv->hkv", kg[s:e], vn)

    h, ht = scan_states(case, step, h0, (HV, K, V))
    return as_states(case, h), unflatten_tokens(case, v_new), ht


def fwd_o(case, q, v_new, g, A, h) -> np.ndarray:
    """q [B, T, H, K], v_new [B, T, HV, V], g (log2 cumsum), A = Aqk [B, T, HV, C], h
    [B, NT, HV, K, V] -> o [B, T, HV, V]."""
    q, vn, G, A = value_heads(case, q), tokens(v_new), tokens(g), tokens(A)
    h = flat_states(h)
    o = np.empty_like(vn)
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        inter = np.einsum("ihk,hkv->ihv", q[s:e] * np.exp2(G[s:e]), h[c])
        o[s:e] = case.scale_value * inter + np.einsum("hij,jhv->ihv", _chunk_matrix(A, s, e), vn[s:e])
    return unflatten_tokens(case, o)


def bwd_dAv(case, v_new, do, A) -> tuple[np.ndarray, np.ndarray]:
    """v_new, do [B, T, HV, V], A = Aqk [B, T, HV, C] -> dAqk [B, T, HV, C] (scale do_i . v_new_j,
    j <= i), dv [B, T, HV, V] (tril(A)^T do)."""
    vn, do, A = tokens(v_new), tokens(do), tokens(A)
    dA, dv = np.zeros(A.shape), np.empty_like(do)
    for _, s, e, _, _ in chunks(case):
        L = e - s
        _put_matrix(dA, case.scale_value * np.einsum("ihv,jhv->hij", do[s:e], vn[s:e]) * np.tril(np.ones((L, L))), s, e)
        dv[s:e] = np.einsum("hij,ihv->jhv", _chunk_matrix(A, s, e), do[s:e])
    return unflatten_tokens(case, dA), unflatten_tokens(case, dv)


def bwd_dhu(case, qg, kg, w, gk, do, dv, dht=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qg, kg, w [B, T, HV, K], gk (log2 cumsum), do, dv [B, T, HV, V], dht [N, HV, K, V] or None
    (0) -> dh [B, NT, HV, K, V] (the gradient of the state after each chunk), dh0 [N, HV, K, V],
    dv [B, T, HV, V] (dv + kg dh)."""
    qg, kg, w, G, do, dv = tokens(qg), tokens(kg), tokens(w), tokens(gk), tokens(do), tokens(dv)
    HV, K, V = G.shape[1], G.shape[2], do.shape[2]
    dv2 = np.empty_like(dv)

    def step(c, s, e, dS):
        d = dv[s:e] + np.einsum("ihk,hkv->ihv", kg[s:e], dS)
        dv2[s:e] = d
        return (
            np.exp2(G[e - 1])[:, :, None] * dS
            + case.scale_value * np.einsum("ihk,ihv->hkv", qg[s:e], do[s:e])
            - np.einsum("ihk,ihv->hkv", w[s:e], d)
        )

    dh, dh0 = scan_states(case, step, dht, (HV, K, V), reverse=True)
    return as_states(case, dh), dh0, unflatten_tokens(case, dv2)


def bwd_wy(case, q, k, v, v_new, g, beta, A, h, do, dh, dv) -> dict[str, np.ndarray]:
    """q, k [B, T, H, K], v, v_new, do, dv [B, T, HV, V], g (log2 cumsum), beta [B, T, HV],
    A = Akk [B, T, HV, C], h, dh [B, NT, HV, K, V] -> dq, dk, dg [B, T, HV, K], dv [B, T, HV, V],
    db [B, T, HV], dAkk [B, T, HV, C] (see the module docstring)."""
    q, k, G, b = value_heads(case, q), value_heads(case, k), tokens(g), tokens(beta)
    v, vn, do, dv, A = tokens(v), tokens(v_new), tokens(do), tokens(dv), tokens(A)
    h = np.asarray(h, np.float64).reshape((-1,) + h.shape[2:])
    dh = np.asarray(dh, np.float64).reshape((-1,) + dh.shape[2:])
    dq, dk, dg = np.empty_like(G), np.empty_like(G), np.empty_like(G)
    dv_out, db, dAkk = np.empty_like(v), np.empty(b.shape), np.zeros(A.shape)
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        L, Gc, kc, bc = e - s, G[s:e], k[s:e], b[s:e][:, :, None]
        eg = np.exp2(Gc)
        Ac = _chunk_matrix(A, s, e)
        dq_c = case.scale_value * eg * np.einsum("ihv,hkv->ihk", do[s:e], h[c])
        dk_s = np.exp2(Gc[-1] - Gc) * np.einsum("ihv,hkv->ihk", vn[s:e], dh[c])
        dw = -np.einsum("ihv,hkv->ihk", dv[s:e], h[c])
        kb = kc * eg
        du = np.einsum("hij,ihv->jhv", Ac, dv[s:e])
        dx = np.einsum("hij,ihk->jhk", Ac, dw)
        dv_out[s:e] = du * bc
        db[s:e] = np.sum(du * v[s:e], -1) + np.sum(dx * kb, -1)
        dq[s:e] = dq_c
        dk[s:e] = dk_s + dx * eg * bc
        dgc = q[s:e] * dq_c - kc * dk_s + kb * dx * bc
        dgc[-1] += np.exp2(Gc[-1]) * np.einsum("hkv,hkv->hk", h[c], dh[c]) + np.sum(kc * dk_s, 0)
        dg[s:e] = dgc
        P = (np.einsum("ihv,jhv->hij", dv[s:e], v[s:e]) + np.einsum("ihk,jhk->hij", dw, kb)) * b[s:e].T[:, None, :]
        P = P * np.tril(np.ones((L, L)), -1)
        At = Ac.transpose(0, 2, 1)
        _put_matrix(dAkk, -(At @ P @ At) * np.tril(np.ones((L, L)), -1), s, e)
    return {
        "dq": unflatten_tokens(case, dq),
        "dk": unflatten_tokens(case, dk),
        "dv": unflatten_tokens(case, dv_out),
        "db": unflatten_tokens(case, db),
        "dg": unflatten_tokens(case, dg),
        "dAkk": unflatten_tokens(case, dAkk),
    }


def bwd_intra(case, q, k, g, beta, dAqk, dAkk, dq, dk, db, dg) -> dict[str, np.ndarray]:
    """q, k [B, T, H, K], g (log2 cumsum), beta [B, T, HV], dAqk, dAkk [B, T, HV, C] (their lower
    triangles read), dq, dk, dg [B, T, HV, K], db [B, T, HV] -> dq, dk, dg, db plus the
    intra-chunk parts (see the module docstring)."""
    q, k, G, b = value_heads(case, q), value_heads(case, k), tokens(g), tokens(beta)
    dAqk, dAkk = tokens(dAqk), tokens(dAkk)
    dq, dk, db, dg = tokens(dq).copy(), tokens(dk).copy(), tokens(db).copy(), tokens(dg).copy()
    for _, s, e, _, _ in chunks(case):
        qc, kc, bc = q[s:e], k[s:e], b[s:e][:, :, None]
        D = _Decays(G[s:e])
        Pq, Pk = _chunk_matrix(dAqk, s, e), _chunk_matrix(dAkk, s, e)
        dq2, X = D.rows(Pq, kc), D.rows(Pk, kc)
        Y = D.cols(Pq, qc) + D.cols(Pk, kc * bc)
        dq[s:e] += dq2
        db[s:e] += np.sum(X * kc, -1)
        dk[s:e] += X * bc + Y
        dg[s:e] += qc * dq2 + (X * bc - Y) * kc
    return {
        "dq": unflatten_tokens(case, dq),
        "dk": unflatten_tokens(case, dk),
        "db": unflatten_tokens(case, db),
        "dg": unflatten_tokens(case, dg),
    }


# ---------------------------------------------------------------- the stage case


def oracle_fwd_intra(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_kda_fwd_intra's outputs on its float64 inputs `x` (cases/stages/kda.py)."""
    return fwd_intra(case, x["q"], x["k"], x["v"], x["gk"], x["beta"])


def oracle_fwd_h(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gated_delta_rule_fwd_h's outputs on its float64 inputs `x`."""
    h, v_new, ht = fwd_h(case, x["k"], x["w"], x["u"], x["gk"], x.get("initial_state"))
    return {"h": h, "v_new": v_new, "ht": ht}


def oracle_fwd_o(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gla_fwd_o_gk's outputs on its float64 inputs `x`."""
    return {"o": fwd_o(case, x["q"], x["v"], x["g"], x["A"], x["h"])}


def oracle_bwd_dAv(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_kda_bwd_dAv's outputs on its float64 inputs `x`."""
    dA, dv = bwd_dAv(case, x["v"], x["do"], x["A"])
    return {"dAqk": dA, "dv": dv}


def oracle_bwd_dhu(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_gated_delta_rule_bwd_dhu's outputs on its float64 inputs `x`."""
    dh, dh0, dv = bwd_dhu(case, x["q"], x["k"], x["w"], x["gk"], x["do"], x["dv"], x.get("dht"))
    return {"dh": dh, "dh0": dh0, "dv": dv}


def oracle_bwd_wy(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_kda_bwd_wy_dqkg_fused's outputs on its float64 inputs `x`."""
    names = ("q", "k", "v", "v_new", "g", "beta", "A", "h", "do", "dh", "dv")
    return bwd_wy(case, *(x[n] for n in names))


def oracle_bwd_intra(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_kda_bwd_intra's outputs on its float64 inputs `x`."""
    names = ("q", "k", "g", "beta", "dAqk", "dAkk", "dq", "dk", "db", "dg")
    return bwd_intra(case, *(x[n] for n in names))


def chain(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every float64 intermediate of the op as FLA's stages pass them, from the op's inputs
    upcast to float64: gk (the log2 chunk-local cumsum), fwd_intra's w, u, kg, Aqk, Akk, fwd_h's
    h, v_new, qg = q exp2(gk), and (for a backward op case) bwd_dAv's dAqk, dv_a, bwd_dhu's dh,
    dv_b, bwd_wy's dq_w, dk_w, db_w, dg_w, dAkk; with the op's own q, k, v, g, beta, do, h0, dht."""
    x = float64_tensors(op_inputs)
    h0 = x.get("initial_state") if case.h0 else None
    dht = x.get("dht") if case.ht else None
    f = dict(x, h0=h0, dht=dht)
    f["gk"] = local_cumsum(case, x["g"])
    f.update(fwd_intra(case, x["q"], x["k"], x["v"], f["gk"], x["beta"]))
    f["h"], f["v_new"], f["ht"] = fwd_h(case, f["kg"], f["w"], f["u"], f["gk"], h0)
    f["qg"] = unflatten_tokens(case, value_heads(case, x["q"]) * np.exp2(tokens(f["gk"])))
    if "do" not in x:
        return f
    f["dAqk"], f["dv_a"] = bwd_dAv(case, f["v_new"], x["do"], f["Aqk"])
    f["dh"], f["dh0"], f["dv_b"] = bwd_dhu(case, f["qg"], f["kg"], f["w"], f["gk"], x["do"], f["dv_a"], dht)
    wy = bwd_wy(
        case, x["q"], x["k"], x["v"], f["v_new"], f["gk"], x["beta"], f["Akk"], f["h"], x["do"], f["dh"], f["dv_b"]
    )
    f.update({f"{n}_w": wy[n] for n in ("dq", "dk", "dv", "db", "dg")}, dAkk=wy["dAkk"])
    return f


# where each stage input comes from in `chain` (the op's own name when not listed)
_SOURCE = {
    "fwd_intra": {"gk": "gk"},
    "fwd_h": {"k": "kg", "initial_state": "h0"},
    "fwd_o": {"v": "v_new", "g": "gk", "A": "Aqk"},
    "bwd_dAv": {"v": "v_new", "A": "Aqk"},
    "bwd_dhu": {"q": "qg", "k": "kg", "dv": "dv_a"},
    "bwd_wy": {"g": "gk", "A": "Akk", "dv": "dv_b"},
    "bwd_intra": {"g": "gk", "dq": "dq_w", "dk": "dk_w", "db": "db_w", "dg": "dg_w"},
}


def stage_inputs_f64(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage's inputs (stage_input_names(case)) in float64, before their cast: the op's own for
    q, k, v, g (local_cumsum), beta, do, initial_state = h0, dht; the rest the stages' float64
    outputs chained from them (`chain`)."""
    f = chain(case, op_inputs)
    src = _SOURCE.get(case.stage, {})
    return {n: f[src.get(n, n)] for n in stage_input_names(case)}


def stage_inputs(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage's inputs (stage_input_names(case), plus cu_seqlens int64 [N + 1] for varlen), each in
    its stage dtype: the op's own tensors exactly (q, k, v, do, g, beta, h0, dht: already in their
    dtypes); the rest computed in float64 (stage_inputs_f64) and rounded once."""
    own = {"q", "k", "v", "do", "beta", "g", "initial_state", "h0", "dht"}
    src = _SOURCE.get(case.stage, {})
    f64 = stage_inputs_f64(case, op_inputs)
    passed = {n: op_inputs["initial_state" if n == "h0" else n] for n in f64 if n in own and src.get(n, n) == n}
    return cast_stage_inputs(case, f64, passed)
