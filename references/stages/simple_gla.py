"""Float64 oracle of Simple GLA's chunk stages (FLA 0.6.0: fla.ops.common.chunk_h, chunk_o,
fla.ops.utils.cumsum), and the stage inputs.

Every formula comes from the per-token recurrence, per sequence and head,
    S_t = exp(g_t) S_{t-1} + k_t^T v_t,   o_t = scale q_t S_t,
regrouped by chunks of C tokens as FLA's stages regroup it. In a chunk (tokens i = 0..L, L the
last valid one; S = h the state before the chunk, dS = dh the gradient of the state after it),
with b2_i the log2 gate cumsum from the chunk start, as the stages receive it (g: the chunk-local
cumsum of the op's g times 1 / ln 2; g_gamma: g_gamma / ln 2 times i + 1) and
D_ij = exp2(b2_i - b2_j) for j <= i, else 0:
    local_cumsum  g_cumsum_i = (g_0 + ... + g_i) / ln 2
    fwd_h         S_end = exp2(b2_L) S + sum_j exp2(b2_L - b2_j) k_j^T v_j;  h = the S before each chunk,
                  ht = S_end of each sequence's last chunk (from h0, or 0)
    fwd_o         o_i = scale (exp2(b2_i) q_i S + sum_j D_ij (q_i . k_j) v_j)
    bwd_dh        dS_prev = exp2(b2_L) dS + scale sum_i exp2(b2_i) q_i^T do_i;  dh = the dS after each
                  chunk (dht, or 0, after a sequence's last), dh0 = dS_prev of each sequence's first
    bwd_dv        dv_j = scale sum_i D_ij (q_i . k_j) do_i + exp2(b2_L - b2_j) k_j dS
    bwd_dqkwg     ds_ij = scale D_ij (do_i . v_j)
                  dq_i = scale exp2(b2_i) do_i S^T + sum_j ds_ij k_j
                  dk_j = exp2(b2_L - b2_j) v_j dS^T + sum_i ds_ij q_i
                  dg_t = d(<do, o> + <dS, S_end>) / d b_t with b = b2 ln 2 the natural-log cumsum
                  (S, dS held fixed; FLA's chunk_bwd_dqkwg returns this, and its op takes the
                  reverse chunk-local cumsum of it as the gradient of the op's g, unscaled):
                      dg_t = scale exp2(b2_t) do_t . (q_t S) + sum_{j<t} M_tj - sum_{i>t} M_it - w_t
                             + [t = L] (exp2(b2_L) <S, dS> + sum_j w_j)
                  with M_ij = ds_ij (q_i . k_j) and w_j = exp2(b2_L - b2_j) k_j . (dS v_j).
Chunks are cut per row (B rows) or per packed sequence (cu_seqlens, B == 1), the last one of a
sequence short; states are indexed by chunk in FLA's order ([B, NT] with NT per row, or [1, NT]
over all packed sequences). Per-chunk loops in numpy float64, heads vectorised.
"""

from __future__ import annotations

import numpy as np

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
)

__all__ = ["RCP_LN2", "chunks", "local_cumsum", "stage_inputs"]

# ---------------------------------------------------------------- layout


def _gate_chunk(case, gate: np.ndarray, s: int, e: int) -> np.ndarray:
    """b2 [L, H]: the log2 gate cumsum of tokens s..e-1 from the chunk start. gate: the flat
    chunk-local log2 cumsum [B * T, H] (g), or g_gamma / ln 2 [H] (b2_i = that times i + 1, as
    FLA's kernels form it)."""
    if case.uses_g_gamma:
        return np.arange(1, e - s + 1, dtype=np.float64)[:, None] * gate[None, :]
    return gate[s:e]


def _flat_gate(case, gate) -> np.ndarray:
    """The stage gate input -> float64 [B * T, H] (g) or [H] (g_gamma)."""
    return np.asarray(gate, np.float64) if case.uses_g_gamma else tokens(gate)


# ---------------------------------------------------------------- stages (float64 in, float64 out)


def fwd_h(case, k, v, gate, h0=None) -> tuple[np.ndarray, np.ndarray]:
    """k [B, T, H, K], v [B, T, H, V], gate (log2: g_cumsum [B, T, H] or g_gamma / ln 2 [H]),
    h0 [N, H, K, V] or None (0) -> h [B, NT, H, K, V] (the state before each chunk),
    ht [N, H, K, V] (each sequence's final state)."""
    k, v, gate = tokens(k), tokens(v), _flat_gate(case, gate)

    def step(c, s, e, S):
        b2 = _gate_chunk(case, gate, s, e)
        kd = k[s:e] * np.exp2(b2[-1] - b2)[:, :, None]
        return np.exp2(b2[-1])[:, None, None] * S + np.einsum("jhk,jhv->hkv", kd, v[s:e])

    h, ht = scan_states(case, step, h0, (case.H, case.K, case.V))
    return as_states(case, h), ht


def fwd_o(case, q, k, v, h, gate) -> np.ndarray:
    """q, k [B, T, H, K], v [B, T, H, V], h [B, NT, H, K, V] (states before the chunks), gate
    (log2) -> o [B, T, H, V]."""
    q, k, v, gate = tokens(q), tokens(k), tokens(v), _flat_gate(case, gate)
    h = flat_states(h)
    o = np.empty_like(v)
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        b2 = _gate_chunk(case, gate, s, e)
        A = np.einsum("ihk,jhk->hij", q[s:e], k[s:e]) * causal_decays(b2)
        inter = np.exp2(b2)[:, :, None] * np.einsum("ihk,hkv->ihv", q[s:e], h[c])
        o[s:e] = case.scale_value * (inter + np.einsum("hij,jhv->ihv", A, v[s:e]))
    return o.reshape(case.B, case.T, case.H, case.V)


def bwd_dh(case, q, do, gate, dht=None) -> tuple[np.ndarray, np.ndarray]:
    """q [B, T, H, K], do [B, T, H, V], gate (log2), dht [N, H, K, V] or None (0) ->
    dh [B, NT, H, K, V] (the gradient of the state after each chunk), dh0 [N, H, K, V]."""
    q, do, gate = tokens(q), tokens(do), _flat_gate(case, gate)

    def step(c, s, e, dS):
        b2 = _gate_chunk(case, gate, s, e)
        qd = case.scale_value * q[s:e] * np.exp2(b2)[:, :, None]
        return np.exp2(b2[-1])[:, None, None] * dS + np.einsum("ihk,ihv->hkv", qd, do[s:e])

    dh, dh0 = scan_states(case, step, dht, (case.H, case.K, case.V), reverse=True)
    return as_states(case, dh), dh0


def bwd_dv(case, q, k, do, dh, gate) -> np.ndarray:
    """q, k [B, T, H, K], do [B, T, H, V], dh [B, NT, H, K, V], gate (log2) -> dv [B, T, H, V]."""
    q, k, do, gate = tokens(q), tokens(k), tokens(do), _flat_gate(case, gate)
    dh = flat_states(dh)
    dv = np.empty_like(do)
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        b2 = _gate_chunk(case, gate, s, e)
        A = case.scale_value * np.einsum("ihk,jhk->hij", q[s:e], k[s:e]) * causal_decays(b2)
        kd = k[s:e] * np.exp2(b2[-1] - b2)[:, :, None]
        dv[s:e] = np.einsum("hij,ihv->jhv", A, do[s:e]) + np.einsum("jhk,hkv->jhv", kd, dh[c])
    return dv.reshape(case.B, case.T, case.H, case.V)


def bwd_dqkwg(case, q, k, v, do, h, dh, gate) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """q, k [B, T, H, K], v, do [B, T, H, V], h, dh [B, NT, H, K, V], gate (log2) ->
    dq, dk [B, T, H, K], dg [B, T, H] (g gates: the gradient w.r.t. the natural-log chunk-local
    cumsum, see the module docstring; None for g_gamma)."""
    q, k, v, do, gate = tokens(q), tokens(k), tokens(v), tokens(do), _flat_gate(case, gate)
    h = flat_states(h)
    dh = flat_states(dh)
    dq, dk, dg = np.empty_like(q), np.empty_like(k), np.empty(q.shape[:2])
    scale = case.scale_value
    for c, (_, s, e, _, _) in enumerate(chunks(case)):
        qc, kc, vc, doc = q[s:e], k[s:e], v[s:e], do[s:e]
        b2 = _gate_chunk(case, gate, s, e)
        ds = scale * np.einsum("ihv,jhv->hij", doc, vc) * causal_decays(b2)  # [H, i, j], j <= i
        dq_state = scale * np.exp2(b2)[:, :, None] * np.einsum("ihv,hkv->ihk", doc, h[c])
        dk_state = np.exp2(b2[-1] - b2)[:, :, None] * np.einsum("jhv,hkv->jhk", vc, dh[c])
        dq[s:e] = dq_state + np.einsum("hij,jhk->ihk", ds, kc)
        dk[s:e] = dk_state + np.einsum("hij,ihk->jhk", ds, qc)
        # dg: the terms of each b_t, the diagonal pairs (i = j, no decay) left out
        M = np.tril(ds * np.einsum("ihk,jhk->hij", qc, kc), -1)
        w = np.einsum("jhk,jhk->jh", kc, dk_state)
        g_t = np.einsum("ihk,ihk->ih", qc, dq_state) + M.sum(2).T - M.sum(1).T - w
        g_t[-1] += np.exp2(b2[-1]) * np.einsum("hkv,hkv->h", h[c], dh[c]) + w.sum(0)
        dg[s:e] = g_t
    shape = (case.B, case.T, case.H)
    dg = None if case.uses_g_gamma else dg.reshape(shape)
    return dq.reshape(shape + (case.K,)), dk.reshape(shape + (case.K,)), dg


# ---------------------------------------------------------------- the stage case


def oracle_fwd_h(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_fwd_h's outputs on its float64 inputs `x` (cases/stages/simple_gla.py)."""
    h, ht = fwd_h(case, x["k"], x["v"], x.get(case.gate_name), x.get("h0"))
    return {"h": h, "ht": ht}


def oracle_fwd_o(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_fwd_o's outputs on its float64 inputs `x`."""
    return {"o": fwd_o(case, x["q"], x["k"], x["v"], x["h"], x.get(case.gate_name))}


def oracle_bwd_dh(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_bwd_dh's outputs on its float64 inputs `x`."""
    dh, dh0 = bwd_dh(case, x["q"], x["do"], x.get(case.gate_name), x.get("dht"))
    return {"dh": dh, "dh0": dh0}


def oracle_bwd_dv(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_bwd_dv's outputs on its float64 inputs `x`."""
    return {"dv": bwd_dv(case, x["q"], x["k"], x["do"], x["dh"], x.get(case.gate_name))}


def oracle_bwd_dqkwg(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_bwd_dqkwg's outputs on its float64 inputs `x` (dg None for g_gamma)."""
    dq, dk, dg = bwd_dqkwg(case, x["q"], x["k"], x["v"], x["do"], x["h"], x["dh"], x.get(case.gate_name))
    return {"dq": dq, "dk": dk, "dg": dg}


def stage_inputs_f64(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage's inputs (cases.stages.stage_input_names) in float64, before their cast, from the op's
    inputs (cases.make_inputs(case.op_case)) upcast to float64: q, k, v, do, g (local_cumsum)
    as they are; h0 = initial_state; dht; the gate in log2 (g: its chunk-local cumsum / ln 2;
    g_gamma / ln 2); h the states before each chunk and dh the gradients of the states after
    each chunk, from that gate."""
    x = float64_tensors(op_inputs)
    names = stage_input_names(case)
    out = {}
    if case.uses_g_gamma:
        gate = x["g_gamma"] * RCP_LN2
    else:
        gate = local_cumsum(case, x["g"])
    h0, dht = x.get("initial_state") if case.h0 else None, x.get("dht") if case.ht else None
    for n in names:
        if n == case.gate_name:
            out[n] = x["g"] if case.stage == "local_cumsum" else gate
        elif n == "h0":
            out[n] = h0
        elif n == "h":
            out[n] = fwd_h(case, x["k"], x["v"], gate, h0)[0]
        elif n == "dh":
            out[n] = bwd_dh(case, x["q"], x["do"], gate, dht)[0]
        elif n == "dht":
            out[n] = dht
        else:
            out[n] = x[n]
    return out


def stage_inputs(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage's inputs (cases.stages.stage_input_names, plus cu_seqlens int64 [N + 1] for varlen), each in
    its stage dtype: q, k, v, do exactly the op's; the rest computed in float64
    (stage_inputs_f64) and rounded once."""
    f64 = stage_inputs_f64(case, op_inputs)
    return cast_stage_inputs(case, f64, {n: op_inputs[n] for n in f64 if n in ("q", "k", "v", "do")})
