"""The one comparison function of the project: a tensor against the float64 oracle.

`compare_tensor(case, name, x, ref, scale)` returns one tensor's metrics record:
    rel_rms          ||x - r||_2 / ||r||_2 over elements where both are finite (primary); the
                     absolute rms error where the oracle is identically zero; given the oracle's
                     error scale (dg_gamma, a sum over tokens: references.error_scales),
                     rms((x - r) / scale), each head against the size of what it sums
    error_scale      that scale, when given
    max_abs          max |x - r|
    max_abs_over_rms max_abs / rms(r)
    max_ulp          max |x - r| in units in the last place of r in the output dtype
    nan, inf         counts in x where the oracle is finite
    worst            the 5 worst elements: index, value, oracle
    profile          rel error per chunk along T (per sequence row for state tensors)
    heatmap          rel error per (chunk, head), [n_chunks][H]
    floor_rel, floor_abs  rounding noise of the output dtype at the oracle's magnitude:
                     the rel_rms / max_abs of the oracle itself rounded to that dtype
    tol, verdict     against parity.measure.tol (tolerance_verdict: pass, fail-accuracy, nan-inf)
    blocks           {"err2": [...], "floor2": [...]}: the squared error and the squared rounding of
                     the oracle, in rel_rms units, per independent block (parity.measure.compute_error:
                     the compute error sqrt(eps^2 - floor^2) and the bound on it are judged from these)
    row_heatmap      state tensors: rel error per (sequence row, head), [N][H]; [1][H] for [H]
    localisation     where the error first exceeds tolerance and what its shape looks like
                     (first chunk, token and head, or sequence and head: parity.measure.localisation,
                     as the record holds it; {} for a tensor that passes)
`error_blocks` gives the blocks alone. The figures of a tensor record's seeds (parity.execute.case
appends one per seed): `seed_figures`, `common_seeds` (those two records share, aligned) and
`compute_judgement` (the compute error judged over them: the figures the bound, parity.judge.bound,
decides on).
"""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np

from cases import Layout, layout_of
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN, block_sums, judge, verdict_after
from parity.measure.localisation import ChunkLocalisation, Localisation, localisation_record, localise
from parity.measure.tol import NP_DTYPES, output_dtype, tol, tolerance_verdict
from parity.model.verdict import Verdict

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


def _chunk_sums(a: np.ndarray, C: int) -> np.ndarray:
    """[B, T, H, ...] -> sums per (chunk along T, head), [n_chunks, H]."""
    B, T, H = a.shape[:3]
    n = -(-T // C)
    a = np.pad(a.reshape(B, T, H, -1).sum(-1, dtype=np.float64), ((0, 0), (0, n * C - T), (0, 0)))
    return a.reshape(B, n, C, H).sum((0, 2))


def _chunk_errors(err2: np.ndarray, ref2: np.ndarray, C: int) -> tuple[list, list]:
    """err2, ref2: squared error / oracle [B, T, H, ...] -> (profile [n_chunks], heatmap [n_chunks][H])."""
    e, r = _chunk_sums(err2, C), _chunk_sums(ref2, C)  # [n, H]
    return _clean(_rel(e.sum(1), r.sum(1))), [_clean(row) for row in _rel(e, r)]


def _row_head_errors(err2: np.ndarray, ref2: np.ndarray) -> list:
    """State-like [N, H, ...] tensors: rel error per (sequence row, head), [N][H]."""
    N, H = err2.shape[:2]
    return [_clean(row) for row in _rel(err2.reshape(N, H, -1).sum(-1), ref2.reshape(N, H, -1).sum(-1))]


def _rel(e: np.ndarray, r: np.ndarray) -> np.ndarray:
    """sqrt(squared error / squared oracle), NaN where the oracle is zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(e / np.where(r > 0, r, np.nan))


def _clean(a) -> list:
    return [None if not np.isfinite(v) else float(v) for v in np.ravel(a)]


def _sequence_errors(err2, ref2, case) -> list | None:
    """rel error per packed sequence for [1, T, ...] varlen tensors."""
    if case.seqlens is None:
        return None
    out = []
    for s, e in zip(case.cu_seqlens[:-1], case.cu_seqlens[1:]):
        den = ref2[:, s:e].sum()
        out.append(_num(math.sqrt(err2[:, s:e].sum() / den)) if den > 0 else None)
    return out


def _first_bad_token(case, err2, ref2, nonfinite, loc: ChunkLocalisation, limit: float) -> int:
    """The first token of the first bad chunk, in its head, whose error (or NaN/Inf) is large:
    |error| over limit x the chunk's oracle rms per token."""
    C, c, h = case.chunk_size, loc.first_chunk, loc.head
    sl = slice(c * C, min((c + 1) * C, err2.shape[1]))
    e = err2[:, sl, h].reshape(err2.shape[0], -1, int(np.prod(err2.shape[3:], dtype=int))).sum((0, 2))
    r = ref2[:, sl, h].sum() / max(1, e.size)
    nf = nonfinite[:, sl, h].reshape(nonfinite.shape[0], e.size, -1).any((0, 2))
    hit = np.flatnonzero(nf | (np.sqrt(e) > limit * math.sqrt(r)))
    return c * C + int(hit[0]) if hit.size else c * C


def error_blocks(case, name: str, x, ref, rounded, scale=None) -> dict:
    """{"err2", "floor2"}: w * (x - ref)^2 and w * (rounded - ref)^2 summed per independent block
    of its layout (parity.measure.compute_error.block_sums), w the per-element weight of rel_rms (so that err2
    sums to rel_rms^2); rounded: ref rounded to the output dtype. Non-finite elements count 0."""
    x = np.asarray(x).astype(np.float64)
    r = np.asarray(ref, np.float64)
    ok = np.isfinite(r)
    r0 = np.where(ok, r, 0.0)
    den2 = float(np.sum(r0**2))
    if scale is not None:
        s = np.broadcast_to(np.asarray(scale, np.float64), r.shape)
        w = 1.0 / (max(1, r.size) * np.where(s > 0, s, 1.0) ** 2)
    else:
        w = 1.0 / max(1, r.size) if den2 == 0 else 1.0 / den2
    diff = np.where(ok & np.isfinite(x), x - r0, 0.0)
    layout = layout_of(case, name)
    return {
        "err2": block_sums(w * diff**2, layout),
        "floor2": block_sums(w * (np.asarray(rounded, np.float64) - r0) ** 2, layout),
    }


def _epsilon(err2: np.ndarray, num: float, den: float, scale) -> float:
    """rel_rms from the squared error `err2` (num = ||x - r||, den = ||r||): num / den; the absolute
    rms error where the oracle is identically zero (the gate gradient when every sequence is one
    token and there is no initial state: its inputs are of unit scale, and rounding noise over a
    zero norm would read inf); given `scale`, rms(error / scale), absolute where the scale is zero
    (the sum and all its terms zero)."""
    if scale is not None:
        s = np.broadcast_to(np.asarray(scale, np.float64), err2.shape)
        return math.sqrt(float(np.mean(err2 / np.where(s > 0, s, 1.0) ** 2))) if err2.size else 0.0
    return num / math.sqrt(max(1, err2.size)) if den == 0 else num / den


def _worst(x: np.ndarray, r: np.ndarray, absd: np.ndarray, both: np.ndarray, ref_ok: np.ndarray) -> list[dict]:
    """The N_WORST elements, non-finite ones (where the oracle is finite) first, then by |x - r|:
    [{"index", "value", "oracle"}]."""
    score = np.where(both, absd, np.where(ref_ok, np.inf, -1.0)).ravel()
    order = np.argsort(-score, kind="stable")[:N_WORST]
    return [
        {
            "index": [int(i) for i in np.unravel_index(j, x.shape)],
            "value": _num(x.ravel()[j]),
            "oracle": _num(r.ravel()[j]),
        }
        for j in order
    ]


def _error_shape(case, layout: Layout, err2: np.ndarray, ref2: np.ndarray, nonfinite: np.ndarray) -> dict:
    """Where the error sits, by the tensor's layout: time tensors {"profile", "heatmap", "sequences"}
    (per chunk, per chunk and head, per packed sequence); per-chunk tensors the same with one entry
    per chunk; states [N, H, K, V] and [H] tensors {"profile"} per leading row, and {"row_heatmap"}
    per (row, head). NaN/Inf elements count as infinite error in sequences and row_heatmap."""
    if layout is Layout.TIME:
        profile, heatmap = _chunk_errors(err2, ref2, case.chunk_size)
        sequences = _sequence_errors(np.where(nonfinite, np.inf, err2), ref2, case)  # None: NaN/Inf
        return {"profile": profile, "heatmap": heatmap, "sequences": sequences}
    if layout is Layout.PER_CHUNK:  # one state per chunk: profiled as a time tensor of chunk size 1
        profile, heatmap = _chunk_errors(err2, ref2, 1)
        return {"profile": profile, "heatmap": heatmap, "sequences": None}
    rows = err2.reshape(err2.shape[0], -1).sum(1), ref2.reshape(ref2.shape[0], -1).sum(1)
    out: dict = {"profile": [float(math.sqrt(e / d)) if d > 0 else None for e, d in zip(*rows)]}
    e = np.where(nonfinite, np.inf, err2)
    if layout is Layout.STATE:
        out["row_heatmap"] = _row_head_errors(e, ref2)
    else:  # [H]: one row of heads
        out["row_heatmap"] = _row_head_errors(e[None], ref2[None])
    return out


def _tol_localisation(case, name: str, rec: dict, err2, ref2, nonfinite) -> Localisation | None:
    """`localise` against the tolerance, the first bad token refined from the elements."""
    tolerance = rec["tol"]
    layout = layout_of(case, name)
    cells = None
    if layout.along_chunks:
        cells = _chunk_sums(nonfinite, case.chunk_size if layout is Layout.TIME else 1) > 0
    loc = localise(case, name, rec, tolerance, "tol", cells)
    if layout is Layout.TIME and loc is not None and loc.first_chunk is not None:
        return dataclasses.replace(loc, first_t=_first_bad_token(case, err2, ref2, nonfinite, loc, tolerance))
    return loc


def compare_tensor(case, name: str, x, ref, scale=None) -> dict:
    """Metrics of `x` (any float dtype) against the float64 oracle `ref` for tensor `name`.
    rel_rms = rms((x - ref) / s): s is ref's rms (||x - ref|| / ||ref||), or, given `scale` (the
    oracle's error scale of the tensor, references.error_scales: per head for dg_gamma [H]), that,
    element by element."""
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
    err2, ref2 = diff**2, r0**2
    den = math.sqrt(float(ref2.sum()))
    eps = _epsilon(err2, math.sqrt(float(err2.sum())), den, scale)
    absd = np.abs(diff)
    max_abs = float(absd.max()) if absd.size else 0.0
    rms_r = den / math.sqrt(max(1, r.size))
    odt = output_dtype(case, name)
    ulps = absd / _ulp(r0, odt)
    rounded = r0.astype(NP_DTYPES[odt]).astype(np.float64)
    tolerance = tol(case, name)
    rec = {
        "dtype": odt,
        "shape": list(x.shape),
        "rel_rms": _num(eps),
        "max_abs": max_abs,
        "max_abs_over_rms": _num(max_abs / rms_r if rms_r > 0 else (0.0 if max_abs == 0 else math.inf)),
        "max_ulp": float(ulps.max()) if ulps.size else 0.0,
        "nan": nan,
        "inf": inf,
        "oracle_nonfinite": int(np.sum(~ref_ok)),
        "oracle_rms": rms_r,
        "oracle_max_abs": float(np.abs(r0).max(initial=0.0)),
        "worst": _worst(x, r, absd, both, ref_ok),
        "floor_rel": rel_rms(rounded, r0),
        "floor_abs": float(np.abs(rounded - r0).max(initial=0.0)),
        "tol": tolerance,
        "blocks": error_blocks(case, name, x, r, rounded, scale),
    }
    if scale is not None:
        rec["error_scale"] = [float(v) for v in np.ravel(scale)]
    nonfinite = ~x_ok & ref_ok
    rec.update(_error_shape(case, layout_of(case, name), err2, ref2, nonfinite))
    rec["verdict"] = tolerance_verdict(nan, inf, eps, tolerance)
    loc = None if rec["verdict"] == Verdict.PASS else _tol_localisation(case, name, rec, err2, ref2, nonfinite)
    rec["localisation"] = localisation_record(loc)
    return rec


def _num(v) -> float | None:
    """JSON-safe float: NaN and +-Inf become None (counts are recorded separately)."""
    v = float(v)
    return v if math.isfinite(v) else None


def seed_figures(t: dict) -> list[dict]:
    """A tensor record's per-seed figures [{"seed", "input_hash", "err2", "floor2", ...}]; a record
    without seeds (compare_tensor's own, as tests make them) is its one seed."""
    if "seeds" in t:
        return t["seeds"]
    if "blocks" not in t:
        return []
    return [{"seed": None, "input_hash": None, "nan": t.get("nan"), "inf": t.get("inf"), **t["blocks"]}]


def finite_seed(s: dict) -> bool:
    """Whether a seed's figures cover every element (no NaN or Inf in that seed's result)."""
    return not (s.get("nan") or s.get("inf"))


def common_seeds(cand: dict, ref: dict) -> tuple[list[dict], list[dict]]:
    """The per-seed figures of the seeds both tensor records hold, in the candidate's order,
    aligned, but for seeds where the reference is NaN or Inf (its figures there leave those
    elements out, so its error is not measured); ValueError when a seed's inputs differ."""
    by_seed = {s["seed"]: s for s in seed_figures(ref) if finite_seed(s)}
    c_out, r_out = [], []
    for s in seed_figures(cand):
        r = by_seed.get(s["seed"])
        if r is None:
            continue
        if r.get("input_hash") != s.get("input_hash"):
            raise ValueError(f"seed {s['seed']}: input hash differs between the candidate and the reference")
        c_out.append(s)
        r_out.append(r)
    return c_out, r_out


def compute_judgement(
    cand: dict, ref: dict, factor: float = 1.0, seeds_min: int = SEEDS_MIN, seeds_max: int = SEEDS_MAX
) -> dict | None:
    """The compute error of two compare_tensor records (with their seeds, parity.execute.case)
    judged over the seeds both hold (compute_error.judge), with "seed_list", "seed_policy" ({"min",
    "max"}) and "state": compute_error.verdict_after under that policy (pass | fail | more |
    inconclusive); None without a common seed. The bound (parity.judge.bound) reads it, and
    `parity run` asks it whether a tensor needs another seed."""
    cs, rs = common_seeds(cand, ref)
    if not cs:
        return None
    j = judge(cs, rs, factor)
    j["seed_list"] = [s["seed"] for s in cs]
    j["seed_policy"] = {"min": seeds_min, "max": seeds_max}
    j["state"] = verdict_after(j, seeds_min, seeds_max)
    return j
