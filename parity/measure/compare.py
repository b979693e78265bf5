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
    tol, verdict     against parity.measure.tol (pass, fail-accuracy, nan-inf)
    blocks           {"err2": [...], "floor2": [...]}: the squared error and the squared rounding of
                     the oracle, in rel_rms units, per independent block (parity.measure.compute_error:
                     the compute error sqrt(eps^2 - floor^2) and the bound on it are judged from these)
    row_heatmap      state tensors: rel error per (sequence row, head), [N][H]; [1][H] for [H]
    localisation     where the error first exceeds tolerance and what its shape looks like
                     (first chunk, token and head, or sequence and head; see localise)
`bound(cand, ref, factor)` judges the compute error over seeds (parity.measure.compute_error) and
max_abs <= factor * (1 + MAX_ABS_MARGIN) * max_abs_r + floor_abs, and names the rule that decided
(BOUND_RULES; `describe_bound` gives it with its figures);
`bound_localisation` says where along T and in which head the candidate exceeds it, and
`describe_localisation` says it in words: across the heads and along the sequence.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from cases import Layout, layout_of
from parity.measure.compute_error import MAX_ABS_MARGIN, SEEDS_MAX, SEEDS_MIN, block_sums, judge, verdict_after
from parity.measure.compute_error import describe as describe_compute
from parity.measure.tol import NP_DTYPES, output_dtype, tol

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


def _vec(values: list, none: float = np.nan) -> np.ndarray:
    """A JSON list (None for NaN/Inf) back to float64, None -> `none`."""
    return np.array([none if v is None else v for v in values], dtype=np.float64)


def _grid(rows: list) -> np.ndarray:
    return np.array([_vec(row) for row in rows]).reshape(len(rows), -1)


# The grid hazards of a port from Triton (independent programs) to Pallas (a sequential loop
# per TensorCore) that an error pattern points to; `localise` names them in its record.
HAZARDS = {
    "after-first-chunk": "state carried along the chunk axis is lost after the first chunk: a sequential grid axis "
    "marked 'parallel' (v4, v5p and TPU7x split parallel axes over two TensorCores; TPU interpret "
    "mode gives each parallel step NaN-filled scratch), or state never written back",
    "some-sequences": "error from a packed sequence's start on: the state is not reset at a sequence start of a "
    "varlen batch (it leaks from the sequence before)",
}


def localise(case, name: str, rec: dict, limit, against: str = "tol", nonfinite_cells=None, seq_limit=None) -> dict:
    """`_localise`, plus the grid hazard a time tensor's pattern points to (HAZARDS), if any."""
    layout = layout_of(case, name)
    loc = _localise(case, layout, rec, limit, against, nonfinite_cells, seq_limit)
    pattern = loc.get("pattern")
    if layout.along_chunks and (pattern in HAZARDS or (pattern == "one-sequence" and loc.get("sequence", 0) > 0)):
        loc["hazard"] = HAZARDS.get(pattern, HAZARDS["some-sequences"])
    elif (
        layout is Layout.TIME
        and rec.get("nan", 0) + rec.get("inf", 0) >= case.chunk_size * min(case.K, case.V)
        and loc.get("first_chunk", 0) > 0
        and pattern in ("local", "uniform")
    ):
        # whole chunks of NaN/Inf (a chunk of one head at least) from a later chunk on, the first clean:
        # what uninitialised carried state gives when the chunk axis runs out of order (TPU interpret
        # mode visits 'parallel' axes in a random order); a stray NaN names no hazard
        loc["hazard"] = HAZARDS["after-first-chunk"]
    return loc


def _localise(case, layout: Layout, rec: dict, limit, against="tol", nonfinite_cells=None, seq_limit=None) -> dict:
    """Where the error of one tensor first exceeds `limit`, and the shape of the error.

    rec: a compare_tensor record (profile, heatmap or row_heatmap, sequences).
    limit: a scalar (the tolerance) or an array of the heatmap's shape (the bound, per
    chunk and head); seq_limit the same per packed sequence (default: limit).
    nonfinite_cells: bool [n_chunks][H], cells holding NaN/Inf.
    Tensors along chunks (time [B, T, H, ...], per chunk [B, NT, H, ...]) give first_chunk,
    first_t (the chunk's start; the comparator refines it to the first bad token), head and a
    pattern: 'first-chunk', 'drift' (grows along T), 'local' (a few chunks), 'after-first-chunk',
    'one-sequence' or 'some-sequences' (of a varlen batch, with their indices), 'single-chunk',
    'uniform' or 'non-finite'.
    State-like tensors: see _localise_rows."""
    if not layout.along_chunks:
        return _localise_rows(rec, limit, against)
    profile, heatmap = rec.get("profile") or [], rec.get("heatmap") or []
    if not profile:
        return {}
    prof = _vec(profile)
    heat = _grid(heatmap)
    limit_heat = np.broadcast_to(np.asarray(limit, np.float64), heat.shape)
    bad = np.nan_to_num(heat, nan=np.inf) > limit_heat
    if nonfinite_cells is not None:
        bad |= np.asarray(nonfinite_cells, bool)
    loc: dict = {
        "against": against,
        "heads": [int(h) for h in np.flatnonzero(bad.any(0))],  # the heads over `limit` in any chunk
        "n_heads": int(bad.shape[1]),
        "chunks_over": int(bad.any(1).sum()),  # chunks over `limit` in any head
        "n_chunks": int(bad.shape[0]),
    }
    if bad.any():
        c = int(np.argwhere(bad)[0][0])
        row = np.where(bad[c], np.nan_to_num(heat[c], nan=np.inf) / limit_heat[c], -np.inf)
        loc.update(first_chunk=c, first_t=c * case.chunk_size, head=int(np.argmax(row)))
    if not np.isfinite(prof).any():
        loc["pattern"] = "non-finite"
        return loc
    # a chunk is over when any of its heads is (a per-head limit makes the profile alone unfit)
    over = bad.any(1)
    sequences = rec.get("sequences")
    if sequences and len(sequences) > 1 and over.any():
        loc.update(_sequence_pattern(sequences, limit if seq_limit is None else seq_limit))
        if "pattern" in loc:
            return loc
    loc["pattern"] = _chunk_pattern(prof, over)
    return loc


def _localise_rows(rec: dict, limit, against: str) -> dict:
    """`_localise` of a state-like tensor, from its row_heatmap: [N, H, K, V] states give the first
    sequence and head over `limit` ('one-sequence', 'all-sequences', or 'state' for one row);
    [H] tensors the first head ('one-head' or 'heads')."""
    grid = rec.get("row_heatmap")
    if not grid:
        return {}
    heat = _grid(grid)
    bad = np.nan_to_num(heat, nan=np.inf) > np.asarray(limit)
    heads = {"heads": [int(i) for i in np.flatnonzero(bad.any(0))], "n_heads": int(bad.shape[1])}
    if not bad.any():  # every (row, head) within `limit`: what fails is not in any one cell
        return {"against": against, "pattern": "uniform", **heads}
    n, h = map(int, np.argwhere(bad)[0])
    if len(rec.get("shape", [])) == 1:  # [H]: per head only
        return {"against": against, "head": h, "pattern": "one-head" if bad.sum() == 1 else "heads", **heads}
    if len(grid) == 1:
        pattern = "state"
    else:
        pattern = "one-sequence" if int(bad.any(1).sum()) == 1 else "all-sequences"
    rows = {"rows_over": [int(i) for i in np.flatnonzero(bad.any(1))], "n_rows": int(bad.shape[0])}
    return {"against": against, "sequence": n, "head": h, "pattern": pattern, **heads, **rows}


def _sequence_pattern(sequences: list, limit) -> dict:
    """Over `limit` (a scalar, or one per sequence) in one packed sequence of a varlen batch
    ({"pattern": "one-sequence", "sequence"}) or in some but not all ({"pattern": "some-sequences",
    "sequences"}: e.g. state leaking from one packed sequence into the next); {} otherwise."""
    seq_bad = np.flatnonzero(_vec(sequences, np.inf) > np.asarray(limit, np.float64))
    if len(seq_bad) == 1:
        return {"pattern": "one-sequence", "sequence": int(seq_bad[0])}
    if 0 < len(seq_bad) < len(sequences):
        return {"pattern": "some-sequences", "sequences": [int(i) for i in seq_bad]}
    return {}


def _chunk_pattern(prof: np.ndarray, over: np.ndarray) -> str:
    """The shape of a time tensor's error along T from its profile (rel error per chunk, with a
    finite value) and which chunks are over the limit: 'single-chunk', 'first-chunk', 'drift',
    'local', 'after-first-chunk' or 'uniform' (the first that fits, in that order)."""
    n = len(prof)
    finite_max = prof[np.isfinite(prof)].max()
    if n == 1:
        return "single-chunk"
    if n >= 3 and over.sum() == 1 and over[0]:
        return "first-chunk"
    if n >= 4 and np.all(np.diff(np.nan_to_num(prof, nan=0.0)) >= -1e-12 * finite_max) and prof[-1] > 2 * prof[0]:
        return "drift"
    if n >= 3 and 0 < over.sum() <= max(1, n // 4):
        return "local"
    if n >= 3 and over.sum() == n - 1 and not over[0]:
        return "after-first-chunk"
    return "uniform"


def bound_localisation(case, name: str, cand: dict, ref: dict, factor: float) -> dict:
    """Where the candidate exceeds the bound: per chunk and head (per sequence and head for
    states), factor x the reference's error there + the dtype floor; a reference cell that
    is NaN/Inf bounds nothing."""
    key = "heatmap" if layout_of(case, name).along_chunks else "row_heatmap"
    if not cand.get(key) or not ref.get(key):
        return {}
    floor = ref.get("floor_rel") or 0.0
    limit = factor * np.nan_to_num(_grid(ref[key]), nan=np.inf) + floor
    seq_limit = None
    if cand.get("sequences") and ref.get("sequences"):
        seq_limit = factor * _vec(ref["sequences"], np.inf) + floor
    return localise(case, name, cand, limit, "bound", seq_limit=seq_limit)


def _first_bad_token(case, err2, ref2, nonfinite, loc: dict, limit: float) -> int:
    """The first token of the first bad chunk, in its head, whose error (or NaN/Inf) is large:
    |error| over limit x the chunk's oracle rms per token."""
    C, c, h = case.chunk_size, loc["first_chunk"], loc["head"]
    sl = slice(c * C, min((c + 1) * C, err2.shape[1]))
    e = err2[:, sl, h].reshape(err2.shape[0], -1, int(np.prod(err2.shape[3:], dtype=int))).sum((0, 2))
    r = ref2[:, sl, h].sum() / max(1, e.size)
    nf = nonfinite[:, sl, h].reshape(nonfinite.shape[0], e.size, -1).any((0, 2))
    hit = np.flatnonzero(nf | (np.sqrt(e) > limit * math.sqrt(r)))
    return c * C + int(hit[0]) if hit.size else c * C


# what each pattern of `localise` says about the error along the sequence (time tensors) or over
# the rows of a state, in words
PATTERN_WORDS = {
    "single-chunk": "the sequence is a single chunk",
    "first-chunk": "the first chunk only",
    "drift": "growing along t (drift)",
    "local": "a few chunks (local)",
    "after-first-chunk": "every chunk after the first",
    "uniform": "no trend along t (uniform)",
    "non-finite": "NaN/Inf in every chunk",
    "one-sequence": "one packed sequence",
    "some-sequences": "some packed sequences",
    "state": "the one state row",
    "all-sequences": "more than one sequence's state",
    "one-head": "one head",
    "heads": "several heads",
}


def _names(what: str, items) -> str:
    items = list(items)
    return f"{what}{'s' if len(items) > 1 else ''} {', '.join(map(str, items))}"


def _heads_words(loc: dict, against: str) -> str:
    """'heads: only head 1 over tol (head 0 within)', 'heads: all 4 over tol', ... ('' for a record
    without the per-head figures)."""
    if "heads" not in loc:
        return ""
    over, n = loc["heads"], loc["n_heads"]
    if not over:
        return f"no chunk, state row or head over {against} in rms (the rule that decided says where)"
    if len(over) == n:
        return f"heads: the only head (head {over[0]}) over {against}" if n == 1 else f"heads: all {n} over {against}"
    within = [h for h in range(n) if h not in over]
    return f"heads: only {_names('head', over)} over {against} ({_names('head', within)} within)"


def _along_words(loc: dict, against: str) -> str:
    """Where along the sequence (time tensors) or over the state rows the error is over `against`."""
    pattern = loc.get("pattern", "")
    words = PATTERN_WORDS.get(pattern, pattern)
    if "heads" in loc and not loc["heads"]:
        return ""  # nothing over anywhere: the heads' words say so
    if pattern == "one-sequence" and "first_chunk" in loc:
        return f"along the sequence: packed sequence {loc['sequence']} only"
    if pattern == "some-sequences":
        return f"along the sequence: packed {_names('sequence', loc['sequences'])} (some-sequences)"
    if "chunks_over" in loc:
        return f"along the sequence: {loc['chunks_over']} of {loc['n_chunks']} chunks over {against}, {words}"
    if "rows_over" in loc:
        if loc["n_rows"] == 1:
            return "the one state row (one sequence)"
        return f"sequences: {_names('sequence', loc['rows_over'])} of {loc['n_rows']} over {against}"
    if "heads" in loc and pattern in ("uniform", "one-head", "heads"):
        return ""  # [H] tensors: the heads' words say it
    return words


def describe_localisation(loc: dict | None) -> str:
    """One line for terminals and reports: where the error is over the tolerance (or the bound)
    across the heads and along the sequence, then the first place, e.g. 'heads: only head 1 over tol
    (head 0 within); along the sequence: 4 of 4 chunks over tol, no trend (uniform); first over tol:
    chunk 0 (t=0), head 1'."""
    if not loc:
        return ""
    against = loc.get("against", "tol")
    parts = [_heads_words(loc, against), _along_words(loc, against)]
    if "first_chunk" in loc:
        parts.append(f"first over {against}: chunk {loc['first_chunk']} (t={loc['first_t']}), head {loc['head']}")
    elif "sequence" in loc and "head" in loc:
        parts.append(f"first over {against}: sequence {loc['sequence']}, head {loc['head']}")
    elif "head" in loc and "heads" not in loc:
        parts.append(f"head {loc['head']}")
    elif "sequence" in loc:
        parts.append(f"sequence {loc['sequence']}")
    if "hazard" in loc:
        parts.append("suspect: " + loc["hazard"])
    return "; ".join(p for p in parts if p)


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


def _verdict(nan: int, inf: int, eps: float, tolerance: float) -> str:
    """pass | fail-accuracy (rel_rms over tolerance, or NaN) | nan-inf (x is NaN/Inf where the oracle is finite)."""
    if nan or inf:
        return "nan-inf"
    return "fail-accuracy" if not eps <= tolerance else "pass"


def _tol_localisation(case, name: str, rec: dict, err2, ref2, nonfinite) -> dict:
    """`localise` against the tolerance, the first bad token refined from the elements."""
    tolerance = rec["tol"]
    layout = layout_of(case, name)
    cells = None
    if layout.along_chunks:
        cells = _chunk_sums(nonfinite, case.chunk_size if layout is Layout.TIME else 1) > 0
    loc = localise(case, name, rec, tolerance, "tol", cells)
    if "first_chunk" in loc and layout is Layout.TIME:
        loc["first_t"] = _first_bad_token(case, err2, ref2, nonfinite, loc, tolerance)
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
    rec["verdict"] = _verdict(nan, inf, eps, tolerance)
    rec["localisation"] = {}
    if rec["verdict"] != "pass":
        rec["localisation"] = _tol_localisation(case, name, rec, err2, ref2, nonfinite)
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


def bound(cand: dict, ref: dict, factor: float = 1.0, seeds_min: int = SEEDS_MIN, seeds_max: int = SEEDS_MAX) -> dict:
    """The bound for two compare_tensor records (with their seeds, parity.execute.case): the compute
    error's, judged over the seeds both hold (compute_error.judge, verdict_after with this seed
    policy: fewer seeds than it needs is `inconclusive`), and max_abs <= factor * (1 + MAX_ABS_MARGIN) *
    max_abs_r + floor_abs on the case's own seed. verdict: pass | fail-bound | inconclusive; ok: verdict == pass."""
    out = {"factor": factor}
    cand_seeds = {s["seed"] for s in seed_figures(cand)}
    shared = [s for s in seed_figures(ref) if s["seed"] in cand_seeds]
    nonfinite_seeds = [s["seed"] for s in shared if not finite_seed(s)]
    # its epsilons cover only its finite elements: no bound from a seed where it is NaN or Inf, and
    # none at all where it is on every seed both ran (or, for a record without seeds, on its own)
    own_nonfinite = bool(ref.get("nan") or ref.get("inf"))  # on the case's own seed (max_abs's)
    ref_nonfinite = own_nonfinite if not shared else len(nonfinite_seeds) == len(shared)
    if ref_nonfinite:
        out["reference_nonfinite"] = True
    elif nonfinite_seeds:
        out["reference_nonfinite_seeds"] = nonfinite_seeds  # left out of the bound
    cand_nonfinite = bool(cand.get("nan") or cand.get("inf")) or cand.get("rel_rms") is None
    verdict = "fail-bound" if cand_nonfinite else "pass"
    out["rule"] = "nan-inf" if cand_nonfinite else "reference-nonfinite" if ref_nonfinite else "max-abs"
    if cand_nonfinite:
        out["nonfinite"] = {"nan": cand.get("nan") or 0, "inf": cand.get("inf") or 0}
    out["rel_rms"] = {"candidate": cand.get("rel_rms"), "reference": ref.get("rel_rms"), "limit": None, "ratio": None}
    if not (ref_nonfinite or cand_nonfinite or ref.get("rel_rms") is None):
        compute, verdict = _compute_bound(cand, ref, factor, seeds_min, seeds_max)
        out.update(compute)
        out["rule"] = _compute_rule(compute.get("compute"), verdict)
    out["max_abs"] = _max_abs_bound(cand, ref, factor, own_nonfinite)
    c, limit = out["max_abs"]["candidate"], out["max_abs"]["limit"]
    if c is None or (limit is not None and not c <= limit):
        out["rule"] = out["rule"] if verdict == "fail-bound" else "max-abs"
        verdict = "fail-bound"
    out["verdict"] = verdict
    out["ok"] = verdict == "pass"
    return out


# The rules of the bound, by the name `bound` records in "rule": the one that decided its verdict
# (for a failure, the first that failed in this order; describe_bound gives its figures).
BOUND_RULES = {
    "nan-inf": "the candidate has NaN/Inf where the oracle is finite",
    "ratio-interval": "the compute error's ratio to the reference's, with its interval over the seeds",
    "rounding-eps-limit": "the reference at the rounding level: eps <= factor x eps_reference + floor",
    "rounding-compute-limit": "the reference at the rounding level: compute error <= factor x the reference's bound",
    "rounding": "the reference at the rounding level: both of its limits",
    "no-common-seed": "no seed with figures in both records",
    "max-abs": "max_abs <= factor x (1 + MAX_ABS_MARGIN) x the reference's + floor_abs",
    "reference-nonfinite": "the reference has NaN/Inf: nothing bounds the candidate",
}


def _compute_rule(j: dict | None, verdict: str) -> str:
    """The BOUND_RULES name of the compute-error judgement `j` that gave `verdict`."""
    if j is None:
        return "no-common-seed"
    if j["method"] == "ratio":
        return "ratio-interval"
    if verdict == "fail-bound":  # compute_error.judge: the eps limit with the indifference zone, else the compute limit
        zone = j["indifference"] / j["factor"] if j["factor"] > 0 else 1.0
        return "rounding-eps-limit" if j["eps_candidate"] > j["limit"] * zone else "rounding-compute-limit"
    return "rounding"


def describe_bound_quantity(b: dict, candidate: str, reference: str) -> str:
    """What the bound compares, with its limit, in one line: the compute errors (the error apart
    from the output's rounding, over the seeds judged) or, where the reference's is at the rounding
    level, the epsilons pooled over those seeds; '' where no compute error was judged. A limit
    printed this way is never under the very figure of the reference it is made from."""
    j, rr = b.get("compute") or {}, b.get("rel_rms") or {}
    if not j or rr.get("limit") is None:
        return ""
    seeds = f"over {j['seeds']} seed(s)"
    if j["method"] == "ratio":
        return (
            f"bound on the compute error (the error apart from the output's rounding), {seeds}: "
            f"c_{candidate} = {fmt(rr['candidate'])} vs limit {fmt(rr['limit'])} = factor {fmt(b.get('factor'))} "
            f"x c_{reference} = {fmt(rr['reference'])}"
        )
    return (
        f"bound on epsilons pooled {seeds} ({reference}'s compute error at the rounding level): "
        f"eps_{candidate} = {fmt(rr['candidate'])} vs limit {fmt(rr['limit'])} = factor {fmt(b.get('factor'))} "
        f"x eps_{reference} = {fmt(rr['reference'])} + the output's rounding floor"
    )


def describe_bound(b: dict) -> str:
    """The rule that decided bound `b` (its "rule") with the figures it used, in one line."""
    rule, j, m = b.get("rule"), b.get("compute") or {}, b.get("max_abs") or {}
    factor = b.get("factor")
    if rule == "nan-inf":
        nf = b.get("nonfinite") or {}
        return f"nan-inf: {nf.get('nan', '?')} NaN and {nf.get('inf', '?')} Inf where the oracle is finite"
    if rule == "max-abs":
        return (
            f"max-abs: max_abs {fmt(m.get('candidate'))} {'<=' if b.get('ok') else '>'} limit {fmt(m.get('limit'))} "
            f"(factor {fmt(factor)} x {fmt(1 + MAX_ABS_MARGIN)} x the reference's {fmt(m.get('reference'))} "
            f"+ floor_abs {fmt(m.get('floor'))})"
            + (f"; compute error {_COMPUTE_STATE[j['state']]}: {describe_compute(j)}" if j.get("state") else "")
        )
    if rule == "ratio-interval":
        edge = j["indifference"]
        # under the policy's minimum of seeds only a verdict far from the bound is taken (verdict_after)
        far = j["seeds"] < (j.get("seed_policy") or {}).get("min", SEEDS_MIN)
        decision = (
            f"lo {fmt(j['lo'])} > {fmt(edge)} (factor x (1 + margin), on fewer seeds than the minimum): fail"
            if j["state"] == "fail" and far
            else f"lo {fmt(j['lo'])} > factor {fmt(factor)}: fail"
            if j["state"] == "fail"
            else f"hi {fmt(j['hi'])} <= factor {fmt(factor)} (on fewer seeds than the minimum): pass"
            if j["state"] == "pass" and far
            else f"hi {fmt(j['hi'])} <= {fmt(edge)} (factor x (1 + margin)): pass"
            if j["state"] == "pass"
            else f"undecided ({b.get('note') or 'the interval holds the factor'})"
        )
        return f"ratio-interval: {describe_compute(j)}; {decision}"
    if rule and rule.startswith("rounding"):
        return f"{rule}: {describe_compute(j)}" + (f" ({b['note']})" if b.get("note") else "")
    if rule == "no-common-seed":
        return f"no-common-seed: {b.get('note', '')}"
    if rule == "reference-nonfinite":
        return "reference-nonfinite: the reference has NaN/Inf; the tolerance alone holds the candidate"
    return ""


def fmt(x) -> str:
    """A record's figure as every surface prints it: 3 significant digits; None (a NaN/Inf metric,
    written as null in records) as "nan/inf"."""
    return "nan/inf" if x is None else f"{x:.3g}"


# compute_error.verdict_after's answer for a compute-error judgement that did not decide the bound
_COMPUTE_STATE = {"pass": "within the bound", "more": "undecided", "inconclusive": "undecided", "fail": "over"}


def _compute_bound(cand: dict, ref: dict, factor: float, seeds_min: int, seeds_max: int) -> tuple[dict, str]:
    """The compute error judged over the seeds both records hold: ({"compute", "rel_rms" (the judged
    figures: c_ or eps_ candidate and reference, limit, ratio), "note" (when undecided)}, verdict)."""
    cs, rs = common_seeds(cand, ref)
    if not cs:
        return {"compute": None, "note": "no seed with figures in both records"}, "inconclusive"
    j = judge(cs, rs, factor)
    j["seed_list"] = [s["seed"] for s in cs]
    j["seed_policy"] = {"min": seeds_min, "max": seeds_max}
    j["state"] = verdict_after(j, seeds_min, seeds_max)
    out: dict = {"compute": j}
    if j["method"] == "ratio":
        out["rel_rms"] = {
            "candidate": j["c_candidate"],
            "reference": j["c_reference"],
            "limit": factor * j["c_reference"],
            "ratio": j["ratio"],
        }
    else:
        out["rel_rms"] = {
            "candidate": j["eps_candidate"],
            "reference": j["eps_reference"],
            "limit": j["limit"],
            "ratio": j["eps_candidate"] / j["eps_reference"] if j["eps_reference"] > 0 else None,
        }
    if j["state"] == "more":
        out["note"] = (
            f"{j['seeds']} seed(s) in both records leave it undecided; the seed policy asks for "
            f"{seeds_min} to {seeds_max}"
        )
    return out, {"pass": "pass", "fail": "fail-bound"}.get(j["state"], "inconclusive")


def _max_abs_bound(cand: dict, ref: dict, factor: float, own_nonfinite: bool) -> dict:
    """{"candidate", "reference", "limit", "ratio"} of max_abs on the case's own seed; limit
    factor * (1 + MAX_ABS_MARGIN) * max_abs_r + floor_abs, None where either max_abs is missing or
    the reference is NaN/Inf there."""
    c, r = cand.get("max_abs"), ref.get("max_abs")
    if c is None or r is None or own_nonfinite:
        return {"candidate": c, "reference": r, "limit": None, "ratio": None}
    return {
        "candidate": c,
        "reference": r,
        "floor": ref["floor_abs"],
        "limit": factor * (1 + MAX_ABS_MARGIN) * r + ref["floor_abs"],
        "ratio": c / r if r > 0 else (0.0 if c == 0 else None),
    }
