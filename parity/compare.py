"""The one comparison function of the project: a tensor against the float64 oracle.

`compare_tensor(case, name, x, ref)` returns the metrics record of shared/DESIGN.md:
    rel_rms          ||x - r||_2 / ||r||_2 over elements where both are finite (primary)
    max_abs          max |x - r|
    max_abs_over_rms max_abs / rms(r)
    max_ulp          max |x - r| in units in the last place of r in the output dtype
    nan, inf         counts in x where the oracle is finite
    worst            the 5 worst elements: index, value, oracle
    profile          rel error per chunk along T (per sequence row for state tensors)
    heatmap          rel error per (chunk, head), [n_chunks][H]
    floor_rel, floor_abs  rounding noise of the output dtype at the oracle's magnitude:
                     the rel_rms / max_abs of the oracle itself rounded to that dtype
    tol, verdict     against parity.tol (pass, fail-accuracy, nan-inf)
    localisation     where the error first exceeds tolerance and what its shape looks like
`bound(cand, ref, factor)` applies eps_c <= factor * eps_r + floor on rel_rms and max_abs.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .tol import NP_DTYPES, output_dtype, tol

TIME_TENSORS = ("o", "dq", "dk", "dv", "dg", "dbeta")   # [B, T, H, ...]
N_WORST = 5


def rel_rms(x, ref) -> float:
    """||x - ref||_2 / ||ref||_2 in float64 (0/0 -> 0, x/0 -> inf)."""
    x = np.asarray(x, np.float64)
    r = np.asarray(ref, np.float64)
    num, den = float(np.linalg.norm(x - r)), float(np.linalg.norm(r))
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return num / den


def _ulp(r: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of the output dtype at |r| (the gap to the next representable number)."""
    fi = ml_dtypes.finfo(NP_DTYPES[dtype])
    mag = np.maximum(np.abs(r), float(fi.tiny))
    exp = np.floor(np.log2(mag))
    return np.exp2(exp - fi.nmant)


def _chunk_errors(err2: np.ndarray, ref2: np.ndarray, C: int) -> tuple[list, list]:
    """err2, ref2: squared error / oracle [B, T, H, ...] -> (profile [n_chunks], heatmap [n_chunks][H])."""
    B, T, H = err2.shape[:3]
    n = -(-T // C)
    pad = n * C - T
    red = lambda a: np.pad(a.reshape(B, T, H, -1).sum(-1), ((0, 0), (0, pad), (0, 0))).reshape(B, n, C, H).sum((0, 2))
    e, r = red(err2), red(ref2)  # [n, H]
    with np.errstate(divide="ignore", invalid="ignore"):
        heat = np.sqrt(e / np.where(r > 0, r, np.nan))
        prof = np.sqrt(e.sum(1) / np.where(r.sum(1) > 0, r.sum(1), np.nan))
    clean = lambda a: [None if not np.isfinite(v) else float(v) for v in np.ravel(a)]
    return clean(prof), [clean(row) for row in heat]


def _sequence_errors(err2, ref2, case) -> list | None:
    """rel error per packed sequence for [1, T, ...] varlen tensors."""
    if case.seqlens is None:
        return None
    out = []
    for s, e in zip(case.cu_seqlens[:-1], case.cu_seqlens[1:]):
        den = ref2[:, s:e].sum()
        out.append(float(math.sqrt(err2[:, s:e].sum() / den)) if den > 0 else None)
    return out


def localise(case, name: str, profile: list, heatmap: list, sequences: list | None, tolerance: float) -> dict:
    """First chunk / time step / head where the error exceeds tolerance, and a label for the
    shape of the error profile: 'drift' (grows along T), 'first-chunk', 'chunk-boundary',
    'one-sequence', 'local' (a few chunks) or 'uniform'."""
    if name not in TIME_TENSORS or not profile:
        return {}
    prof = np.array([np.nan if v is None else v for v in profile])
    heat = np.array([[np.nan if v is None else v for v in row] for row in heatmap])
    bad = np.nan_to_num(heat, nan=np.inf) > tolerance
    loc: dict = {}
    if bad.any():
        c, h = map(int, np.argwhere(bad)[0])
        loc.update(first_chunk=c, first_t=c * case.chunk_size, head=int(np.nanargmax(heat[c])) if np.isfinite(heat[c]).any() else h)
    finite = prof[np.isfinite(prof)]
    if finite.size == 0:
        loc["pattern"] = "non-finite"
        return loc
    over = np.nan_to_num(prof, nan=np.inf) > tolerance
    n = len(prof)
    if sequences and len(sequences) > 1:
        seq = np.array([np.nan if v is None else v for v in sequences])
        if np.nanmax(seq) > tolerance and np.sum(seq > tolerance) == 1:
            loc["pattern"] = "one-sequence"
            loc["sequence"] = int(np.nanargmax(seq))
            return loc
    if n >= 3 and over.sum() == 1 and over[0]:
        loc["pattern"] = "first-chunk"
    elif n >= 4 and np.all(np.diff(np.nan_to_num(prof, nan=0.0)) >= -1e-12 * finite.max()) and prof[-1] > 2 * prof[0]:
        loc["pattern"] = "drift"
    elif n >= 3 and 0 < over.sum() <= max(1, n // 4):
        loc["pattern"] = "local"
    elif n >= 3 and over.sum() == n - 1 and not over[0]:
        loc["pattern"] = "after-first-chunk"
    else:
        loc["pattern"] = "uniform"
    return loc


def compare_tensor(case, name: str, x, ref) -> dict:
    """Metrics of `x` (any float dtype) against the float64 oracle `ref` for tensor `name`."""
    x = np.asarray(x).astype(np.float64)
    r = np.asarray(ref, np.float64)
    if x.shape != r.shape:
        raise ValueError(f"{name}: shape {x.shape} differs from the oracle's {r.shape}")
    ref_ok = np.isfinite(r)
    x_ok = np.isfinite(x)
    both = ref_ok & x_ok
    nan = int(np.sum(np.isnan(x) & ref_ok))
    inf = int(np.sum(np.isinf(x) & ref_ok))
    diff = np.where(both, x - r, 0.0)
    r0 = np.where(ref_ok, r, 0.0)
    err2, ref2 = diff ** 2, r0 ** 2
    den = math.sqrt(float(ref2.sum()))
    num = math.sqrt(float(err2.sum()))
    eps = (0.0 if num == 0 else math.inf) if den == 0 else num / den
    absd = np.abs(diff)
    max_abs = float(absd.max()) if absd.size else 0.0
    rms_r = den / math.sqrt(max(1, r.size))
    odt = output_dtype(case, name)
    ulps = absd / _ulp(r0, odt)
    rounded = r0.astype(NP_DTYPES[odt]).astype(np.float64)
    # worst elements: non-finite ones first, then by |x - r|
    score = np.where(both, absd, np.where(ref_ok, np.inf, -1.0)).ravel()
    order = np.argsort(-score, kind="stable")[:N_WORST]
    worst = [{"index": [int(i) for i in np.unravel_index(j, x.shape)],
              "value": _num(x.ravel()[j]), "oracle": _num(r.ravel()[j])} for j in order]
    tolerance = tol(case, name)
    rec = {
        "dtype": odt, "shape": list(x.shape), "rel_rms": eps, "max_abs": max_abs,
        "max_abs_over_rms": max_abs / rms_r if rms_r > 0 else (0.0 if max_abs == 0 else math.inf),
        "max_ulp": float(ulps.max()) if ulps.size else 0.0, "nan": nan, "inf": inf,
        "oracle_nonfinite": int(np.sum(~ref_ok)), "oracle_rms": rms_r, "oracle_max_abs": float(np.abs(r0).max(initial=0.0)),
        "worst": worst, "floor_rel": rel_rms(rounded, r0), "floor_abs": float(np.abs(rounded - r0).max(initial=0.0)),
        "tol": tolerance,
    }
    if name in TIME_TENSORS:
        rec["profile"], rec["heatmap"] = _chunk_errors(err2, ref2, case.chunk_size)
        rec["sequences"] = _sequence_errors(err2, ref2, case)
    else:  # state-like [N, H, K, V] or [H]: one value per leading row
        rows = err2.reshape(err2.shape[0], -1).sum(1), ref2.reshape(ref2.shape[0], -1).sum(1)
        rec["profile"] = [float(math.sqrt(e / d)) if d > 0 else None for e, d in zip(*rows)]
    if nan or inf:
        rec["verdict"] = "nan-inf"
    elif not eps <= tolerance:
        rec["verdict"] = "fail-accuracy"
    else:
        rec["verdict"] = "pass"
    rec["rel_rms"], rec["max_abs_over_rms"] = _num(rec["rel_rms"]), _num(rec["max_abs_over_rms"])
    rec["localisation"] = localise(case, name, rec.get("profile", []), rec.get("heatmap", []),
                                   rec.get("sequences"), tolerance) if rec["verdict"] != "pass" else {}
    return rec


def _num(v) -> float | None:
    """JSON-safe float: NaN and +-Inf become None (counts are recorded separately)."""
    v = float(v)
    return v if math.isfinite(v) else None


def bound(cand: dict, ref: dict, factor: float = 1.0) -> dict:
    """eps_c <= factor * eps_r + floor on rel_rms and on max_abs, for two compare_tensor records."""
    out = {"factor": factor}
    ok = True
    ref_nonfinite = bool(ref.get("nan") or ref.get("inf"))
    if ref_nonfinite:  # its epsilons cover only its finite elements: no bound from it
        out["reference_nonfinite"] = True
    for metric, floor in (("rel_rms", "floor_rel"), ("max_abs", "floor_abs")):
        c, r = cand.get(metric), ref.get(metric)
        if c is None or r is None or ref_nonfinite:
            out[metric] = {"candidate": c, "reference": r, "limit": None, "ratio": None}
            ok = ok and c is not None   # a reference with NaN bounds nothing; a NaN candidate fails
            continue
        limit = factor * r + ref[floor]
        out[metric] = {"candidate": c, "reference": r, "limit": limit,
                       "ratio": c / r if r > 0 else (0.0 if c == 0 else None)}
        ok = ok and c <= limit
    out["ok"] = bool(ok and not cand.get("nan") and not cand.get("inf"))
    return out
