"""Layout helpers shared by the ops' float64 stage oracles (references/stages/<op>.py).

Tokens are flattened to [B * T, heads, ...] (flat token index b * T + t); per-chunk states to
[B * NT, heads, K, V] (row c: chunk c in FLA's order, `chunks`).
"""

from __future__ import annotations

import numpy as np

from cases.inputs import STORAGE_DTYPES
from cases.stages import RCP_LN2, stage_dtype


def chunks(case) -> list[tuple[int, int, int, bool, bool]]:
    """The chunks in FLA's order: (sequence n, first flat token s, end e, first of its sequence,
    last of its sequence); flat token index b * T + t. Chunk c's state is row c of the states
    flattened to [B * NT, heads, K, V]."""
    if case.seqlens is not None:
        cu = case.cu_seqlens
        seqs = [(cu[n], cu[n + 1]) for n in range(len(case.seqlens))]
    else:
        seqs = [(b * case.T, (b + 1) * case.T) for b in range(case.B)]
    C, out = case.chunk_size, []
    for n, (s0, e0) in enumerate(seqs):
        for s in range(s0, e0, C):
            out.append((n, s, min(s + C, e0), s == s0, s + C >= e0))
    return out


def scan_states(case, step, init, shape: tuple[int, ...], reverse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A recurrence over the chunks, in FLA's order (reverse: from the last chunk back). S starts
    at each sequence's first chunk (reverse: its last) as init[n] in float64 (init [N, *shape], or
    None: zeros); S = step(c, s, e, S) for chunk c of flat tokens s..e-1. Returns states
    [B * NT, *shape] (row c: S entering chunk c) and finals [N, *shape] (S after each sequence's
    last chunk; reverse: after its first)."""
    spans = chunks(case)
    states, finals = np.empty((len(spans),) + shape), np.empty((case.N,) + shape)
    S = None
    for c in reversed(range(len(spans))) if reverse else range(len(spans)):
        n, s, e, first, last = spans[c]
        if last if reverse else first:
            S = np.zeros(shape) if init is None else np.asarray(init[n], np.float64)
        states[c] = S
        S = step(c, s, e, S)
        if first if reverse else last:
            finals[n] = S
    return states, finals


def tokens(x) -> np.ndarray:
    """[B, T, heads, ...] -> float64 [B * T, heads, ...]."""
    x = np.asarray(x, np.float64)
    return x.reshape((-1,) + x.shape[2:])


def unflatten_tokens(case, flat: np.ndarray) -> np.ndarray:
    """[B * T, ...] -> [B, T, ...]."""
    return flat.reshape((case.B, case.T) + flat.shape[1:])


def value_heads(case, x) -> np.ndarray:
    """q or k [B, T, H, K] -> float64 [B * T, HV, K]: value head j reads q, k head j // G."""
    return np.repeat(tokens(x), case.G, axis=1)


def as_states(case, flat: np.ndarray) -> np.ndarray:
    """[B * NT, heads, K, V] -> [B, NT, heads, K, V]."""
    return flat.reshape((case.B, -1) + flat.shape[1:])


def flat_states(h) -> np.ndarray:
    """[B, NT, heads, K, V] -> float64 [B * NT, heads, K, V]."""
    h = np.asarray(h, np.float64)
    return h.reshape((-1,) + h.shape[2:])


def float64_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor but cu_seqlens, upcast to float64, by name."""
    return {n: np.asarray(a, np.float64) for n, a in tensors.items() if n != "cu_seqlens"}


def causal_decays(b2: np.ndarray, strict: bool = False) -> np.ndarray:
    """D [heads, L(i), L(j)] = exp2(b2_i - b2_j) for j <= i (j < i when strict), else 0 (never
    formed above the diagonal). b2 [L, heads]: a per-head log2 gate cumsum."""
    L = b2.shape[0]
    keep = np.tril(np.ones((L, L), bool), -1 if strict else 0)
    diff = b2.T[:, :, None] - b2.T[:, None, :]
    return np.exp2(np.where(keep, diff, -np.inf))


def local_cumsum(case, g) -> np.ndarray:
    """g [B, T, heads, ...] (the op's natural-log gates) -> g_cumsum of the same shape: the
    cumsum within each chunk, times 1 / ln 2."""
    x = tokens(g)
    out = np.empty_like(x)
    for _, s, e, _, _ in chunks(case):
        out[s:e] = np.cumsum(x[s:e], axis=0) * RCP_LN2
    return out.reshape(np.shape(g))


def oracle_local_cumsum(case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """chunk_local_cumsum's outputs on its float64 inputs `x` (every op's local_cumsum stage)."""
    return {"g_cumsum": local_cumsum(case, x["g"])}


def cast_stage_inputs(case, f64: dict[str, np.ndarray], own: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage inputs as passed (plus cu_seqlens int64 [N + 1] for varlen): each name of `own`
    (stage input name -> the op's tensor passed as it is) as the op's own bytes, every other
    float64 input of `f64` rounded once to its stage dtype (cases.stages.stage_dtype); f64's
    order. AssertionError when an op tensor is not in its stage dtype."""
    out = {}
    for n, a in f64.items():
        dtype = STORAGE_DTYPES[stage_dtype(case, n)]
        out[n] = np.ascontiguousarray(own[n] if n in own else a.astype(dtype))
        assert out[n].dtype == dtype, (case.stage, n, out[n].dtype)
    if case.seqlens is not None:
        out["cu_seqlens"] = np.asarray(case.cu_seqlens, np.int64)
    return out
