"""Where a tensor's error is over a limit (the tolerance, or the bound per chunk and head), and the
shape of that error: `localise` reads a compare_tensor record's figures (profile, heatmap or
row_heatmap, sequences) and gives a typed value.

    ChunkLocalisation   a tensor along chunks (time [B, T, H, ...], per chunk [B, NT, H, ...]):
                        the heads and chunks over, the first chunk, token and head over, the
                        pattern along T, and the grid hazard it points to (HAZARDS)
    RowLocalisation     a state [N, H, K, V] or a [H] tensor: the heads and sequence rows over,
                        the first (sequence, head) over, the pattern over the rows

A record holds a localisation as a JSON object ({} for none; a further seed's adds "seed"):
`localisation_record` writes one, `read_localisation` reads one back. `bound_localisation`
localises a candidate against the bound (the reference's error per cell, times the factor, plus
the dtype's floor).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cases import Layout, layout_of

# The grid hazards of a port from Triton (independent programs) to Pallas (a sequential loop
# per TensorCore) that an error pattern points to; `localise` names them in its result.
HAZARDS = {
    "after-first-chunk": "state carried along the chunk axis is lost after the first chunk: a sequential grid axis "
    "marked 'parallel' (v4, v5p and TPU7x split parallel axes over two TensorCores; TPU interpret "
    "mode gives each parallel step NaN-filled scratch), or state never written back",
    "some-sequences": "error from a packed sequence's start on: the state is not reset at a sequence start of a "
    "varlen batch (it leaks from the sequence before)",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChunkLocalisation:
    """A tensor along chunks against `against` ("tol" or "bound"). pattern: 'first-chunk', 'drift'
    (grows along T), 'local' (a few chunks), 'after-first-chunk', 'one-sequence' (`sequence`) or
    'some-sequences' (`sequences`) of a varlen batch, 'single-chunk', 'uniform' or 'non-finite'.
    The fields are in the order a record holds them; None fields are left out of it."""

    against: str
    heads: list[int]  # the heads over the limit in any chunk
    n_heads: int
    chunks_over: int  # chunks over the limit in any head
    n_chunks: int
    first_chunk: int | None = None  # the first (chunk, head) over the limit, None where none is
    first_t: int | None = None  # its first token (the chunk's start, or the first bad token)
    head: int | None = None
    pattern: str
    sequence: int | None = None  # 'one-sequence'
    sequences: list[int] | None = None  # 'some-sequences'
    hazard: str | None = None  # HAZARDS: what the pattern points to in a Pallas port
    seed: int | None = None  # the input seed it is of, where a further seed failed first (parity.execute.case)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowLocalisation:
    """A state [N, H, K, V] or [H] tensor against `against`. pattern: 'one-sequence',
    'all-sequences' or 'state' (one row) for states, 'one-head' or 'heads' for [H] tensors,
    'uniform' where no (row, head) is over (what fails is not in any one cell). The fields are in
    the order a record holds them; None fields are left out of it."""

    against: str
    sequence: int | None = None  # the first (sequence row, head) over the limit (states)
    head: int | None = None  # its head; the first head over for [H] tensors
    pattern: str
    heads: list[int]  # the heads over the limit in any row
    n_heads: int
    rows_over: list[int] | None = None  # states: the sequence rows over the limit in any head
    n_rows: int | None = None
    seed: int | None = None  # the input seed it is of, where a further seed failed first (parity.execute.case)


Localisation = ChunkLocalisation | RowLocalisation


def localisation_record(loc: Localisation | None) -> dict:
    """`loc` as a record holds it: its fields that are set, in order; {} for None."""
    if loc is None:
        return {}
    return {f.name: getattr(loc, f.name) for f in dataclasses.fields(loc) if getattr(loc, f.name) is not None}


def read_localisation(record: dict | None) -> Localisation | None:
    """A record's localisation object back as its type (a tensor along chunks has chunks_over);
    None where it localises nothing: {}, None, or only the seed it is of."""
    if not record or not record.keys() - {"seed"}:
        return None
    return ChunkLocalisation(**record) if "chunks_over" in record else RowLocalisation(**record)


def _vec(values: list, none: float = np.nan) -> np.ndarray:
    """A JSON list (None for NaN/Inf) back to float64, None -> `none`."""
    return np.array([none if v is None else v for v in values], dtype=np.float64)


def _grid(rows: list) -> np.ndarray:
    return np.array([_vec(row) for row in rows]).reshape(len(rows), -1)


def localise(
    case, name: str, rec: dict, limit, against: str = "tol", nonfinite_cells=None, seq_limit=None
) -> Localisation | None:
    """Where the error of tensor `name` first exceeds `limit`, and the shape of the error; None
    where its record has no figures to localise with.

    rec: a compare_tensor record (profile, heatmap or row_heatmap, sequences).
    limit: a scalar (the tolerance) or an array of the heatmap's shape (the bound, per chunk and
    head); seq_limit the same per packed sequence (default: limit).
    nonfinite_cells: bool [n_chunks][H], cells holding NaN/Inf.
    Along chunks, first_t is the first chunk's start (the comparator refines it to the first bad
    token), and the result names the grid hazard its pattern points to (HAZARDS), if any."""
    layout = layout_of(case, name)
    if not layout.along_chunks:
        return _localise_rows(rec, limit, against)
    loc = _localise_chunks(case, rec, limit, against, nonfinite_cells, seq_limit)
    if loc is None:
        return None
    hazard = _hazard(case, layout, rec, loc)
    return dataclasses.replace(loc, hazard=hazard) if hazard else loc


def _hazard(case, layout: Layout, rec: dict, loc: ChunkLocalisation) -> str | None:
    """The grid hazard (HAZARDS) the pattern of `loc` points to, or None."""
    if loc.pattern in HAZARDS or (loc.pattern == "one-sequence" and loc.sequence > 0):
        return HAZARDS.get(loc.pattern, HAZARDS["some-sequences"])
    if (
        layout is Layout.TIME
        and rec.get("nan", 0) + rec.get("inf", 0) >= case.chunk_size * min(case.K, case.V)
        and (loc.first_chunk or 0) > 0
        and loc.pattern in ("local", "uniform")
    ):
        # whole chunks of NaN/Inf (a chunk of one head at least) from a later chunk on, the first clean:
        # what uninitialised carried state gives when the chunk axis runs out of order (TPU interpret
        # mode visits 'parallel' axes in a random order); a stray NaN names no hazard
        return HAZARDS["after-first-chunk"]
    return None


def _localise_chunks(case, rec: dict, limit, against: str, nonfinite_cells, seq_limit) -> ChunkLocalisation | None:
    """`localise` of a tensor along chunks, from its profile and heatmap."""
    profile, heatmap = rec.get("profile") or [], rec.get("heatmap") or []
    if not profile:
        return None
    prof = _vec(profile)
    heat = _grid(heatmap)
    limit_heat = np.broadcast_to(np.asarray(limit, np.float64), heat.shape)
    bad = np.nan_to_num(heat, nan=np.inf) > limit_heat
    if nonfinite_cells is not None:
        bad |= np.asarray(nonfinite_cells, bool)
    over = bad.any(1)  # a chunk is over when any of its heads is (a per-head limit makes the profile alone unfit)
    figures: dict = {
        "against": against,
        "heads": [int(h) for h in np.flatnonzero(bad.any(0))],
        "n_heads": int(bad.shape[1]),
        "chunks_over": int(over.sum()),
        "n_chunks": int(bad.shape[0]),
    }
    if bad.any():
        c = int(np.argwhere(bad)[0][0])
        row = np.where(bad[c], np.nan_to_num(heat[c], nan=np.inf) / limit_heat[c], -np.inf)
        figures.update(first_chunk=c, first_t=c * case.chunk_size, head=int(np.argmax(row)))
    if not np.isfinite(prof).any():
        return ChunkLocalisation(**figures, pattern="non-finite")
    sequences = rec.get("sequences")
    if sequences and len(sequences) > 1 and over.any():
        in_sequences = _sequence_pattern(sequences, limit if seq_limit is None else seq_limit)
        if in_sequences:
            return ChunkLocalisation(**figures, **in_sequences)
    return ChunkLocalisation(**figures, pattern=_chunk_pattern(prof, over))


def _localise_rows(rec: dict, limit, against: str) -> RowLocalisation | None:
    """`localise` of a state-like tensor, from its row_heatmap: [N, H, K, V] states give the first
    sequence and head over `limit` ('one-sequence', 'all-sequences', or 'state' for one row);
    [H] tensors the first head ('one-head' or 'heads')."""
    grid = rec.get("row_heatmap")
    if not grid:
        return None
    heat = _grid(grid)
    bad = np.nan_to_num(heat, nan=np.inf) > np.asarray(limit)
    heads = {"heads": [int(i) for i in np.flatnonzero(bad.any(0))], "n_heads": int(bad.shape[1])}
    if not bad.any():  # every (row, head) within `limit`: what fails is not in any one cell
        return RowLocalisation(against=against, pattern="uniform", **heads)
    n, h = map(int, np.argwhere(bad)[0])
    if len(rec.get("shape", [])) == 1:  # [H]: per head only
        return RowLocalisation(against=against, head=h, pattern="one-head" if bad.sum() == 1 else "heads", **heads)
    if len(grid) == 1:
        pattern = "state"
    else:
        pattern = "one-sequence" if int(bad.any(1).sum()) == 1 else "all-sequences"
    return RowLocalisation(
        against=against,
        sequence=n,
        head=h,
        pattern=pattern,
        **heads,
        rows_over=[int(i) for i in np.flatnonzero(bad.any(1))],
        n_rows=int(bad.shape[0]),
    )


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


def bound_localisation(case, name: str, cand: dict, ref: dict, factor: float) -> Localisation | None:
    """Where the candidate exceeds the bound: per chunk and head (per sequence and head for
    states), factor x the reference's error there + the dtype floor; a reference cell that
    is NaN/Inf bounds nothing."""
    key = "heatmap" if layout_of(case, name).along_chunks else "row_heatmap"
    if not cand.get(key) or not ref.get(key):
        return None
    floor = ref.get("floor_rel") or 0.0
    limit = factor * np.nan_to_num(_grid(ref[key]), nan=np.inf) + floor
    seq_limit = None
    if cand.get("sequences") and ref.get("sequences"):
        seq_limit = factor * _vec(ref["sequences"], np.inf) + floor
    return localise(case, name, cand, limit, "bound", seq_limit=seq_limit)
