"""hypothesis strategies that build valid cases (invalid combinations are never drawn)
and shrink towards small ones.

`case(op=...)`        a uniform draw over the registry's space (the id round-trip test).
`boundary_case(space)` draws aimed where chunked kernels break (`parity fuzz`): lengths at
                      the chunk grid, one-token tails, length-1 packed sequences, head dims
                      at tile edges, H > 2, K != V both ways, gates into the overflow regime;
                      bounded by `space.max_elements` so one example costs seconds on a CPU.
Every bias names the bug class it is for. Shrinking goes towards the first value of each
axis (B = 1, H = 1, the smallest chunk and head dim, forward only, float32, no state).
"""

from __future__ import annotations

import dataclasses

from hypothesis import reject
from hypothesis import strategies as st

from cases.case import CHUNK_SIZES, DELTA_OPS, GATES, OPS, Case
from cases.inputs import input_size

# head dims, ascending (shrinking goes to the first): the sublane (8) and small heads; FLA's
# off-grid test dims 60 and 100; the 128-lane tile and one off it both ways (127, 129, 136: a
# BlockSpec or mask at a tile edge); two tiles (256, wide-tile-overwrite: tiles overwritten when
# K or V > 128); V = 512 of real models (GLA-1.3B, RetNet). Bug classes: docs/mutants.md
HEAD_DIMS = (8, 16, 32, 60, 64, 100, 120, 127, 128, 129, 136, 192, 256, 512)
DTYPES = ("float32", "bfloat16")
DIRECTIONS = ("fwd", "fwdbwd")
OVERFLOW_EXP = 88.7  # exp(x) overflows float32 above this (masked-exp-overflow: |gamma| * C > 88.7)
SEEDS = 4  # input seeds drawn: 0 .. SEEDS - 1


@st.composite
def seqlens(draw, max_T: int = 256):
    """Packed sequence lengths (>= 1 each), total at most max_T."""
    n = draw(st.integers(1, 4))
    return tuple(draw(st.lists(st.integers(1, max_T // n), min_size=n, max_size=n)))


@st.composite
def case(
    draw,
    op: str | None = None,
    max_T: int = 256,
    dtypes=("float32", "bfloat16"),
    directions=("fwd", "fwdbwd"),
    kv=(16, 60, 64, 100, 128, 256, 512),
):
    """A valid Case; pass op= to fix the op, max_T to bound the sequence length."""
    op = op or draw(st.sampled_from(OPS))
    gate = draw(st.sampled_from([g for g, (ops, _) in GATES.items() if op in ops]))
    defaults = GATES[gate][1]
    params = {}
    if gate == "gamma_alibi" and draw(st.booleans()):
        layers = draw(st.integers(2, 24))
        params = {"layers": layers, "layer": draw(st.integers(0, layers - 1))}
    elif "norm" in defaults and draw(st.booleans()):
        params = {"norm": draw(st.integers(1, 32))}
    elif "mag" in defaults and draw(st.booleans()):
        params = {"mag": draw(st.integers(1, 4))}
    varlen = draw(st.booleans())
    lens = draw(seqlens(max_T)) if varlen else None
    T = sum(lens) if lens else draw(st.integers(1, max_T))
    H = draw(st.integers(1, 4))
    G = draw(st.sampled_from([1, 2, 3])) if op in DELTA_OPS else 1  # grouped value heads
    return Case(
        op=op,
        B=1 if lens else draw(st.integers(1, 2)),
        T=T,
        H=H,
        HV=G * H if G > 1 else None,
        K=draw(st.sampled_from(kv)),
        V=draw(st.sampled_from(kv)),
        dtype=draw(st.sampled_from(dtypes)),
        chunk_size=draw(st.sampled_from([64, 128])),
        gate=gate,
        gate_params=params,
        scale=draw(st.one_of(st.none(), st.sampled_from([0.05, 0.125, 1.0]))),
        h0=draw(st.booleans()),
        ht=draw(st.booleans()),
        seqlens=lens,
        seed=draw(st.integers(0, 3)),
        direction=draw(st.sampled_from(directions)),
    )


# ------------------------------------------------------------------ the search space of parity fuzz
@dataclasses.dataclass(frozen=True)
class Space:
    """The values `boundary_case` draws from for one op (each valid for it; `parity fuzz`
    narrows them to where the candidate has a kernel), and the size bound."""

    op: str
    dtypes: tuple[str, ...] = DTYPES
    k_dims: tuple[int, ...] = HEAD_DIMS
    v_dims: tuple[int, ...] = HEAD_DIMS
    gates: tuple[str, ...] = ()  # () = every gate of the op
    chunk_sizes: tuple[int, ...] = CHUNK_SIZES
    directions: tuple[str, ...] = DIRECTIONS
    max_H: int = 4
    max_T: int = 512
    max_elements: int = 2**18  # input elements (cases.input_size), all inputs together

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"Space.op={self.op!r}: expected one of {list(OPS)}")
        if not self.gates:
            object.__setattr__(self, "gates", tuple(g for g, (ops, _) in GATES.items() if self.op in ops))
        for field in ("dtypes", "k_dims", "v_dims", "gates", "chunk_sizes", "directions"):
            if not getattr(self, field):
                raise ValueError(f"Space.{field} is empty: nothing to draw for {self.op}")
        if self.max_H < 1 or self.max_T < 1 or self.max_elements < 1:
            raise ValueError("Space.max_H, max_T and max_elements must be >= 1")

    def fits(self, case: Case) -> bool:
        """Whether the case's inputs are within max_elements."""
        return input_size(case)[0] <= self.max_elements


@st.composite
def near_chunk_grid(draw, C: int, max_T: int):
    """A length at the chunk grid: k*C, k*C + 1 or k*C - 1 (k >= 1), at most max_T.
    Bug class: an off-by-one in the last chunk's mask, padding or state update; k*C + 1 leaves
    a one-token tail chunk, k*C - 1 a tail one token short of full."""
    k = draw(st.integers(1, max(1, max_T // C)))
    return max(1, min(max_T, k * C + draw(st.sampled_from((0, 1, -1)))))


def length(C: int, max_T: int):
    """A sequence length: at the chunk grid (near_chunk_grid) or anywhere in 1..max_T (a
    single chunk shorter than C included)."""
    return st.one_of(near_chunk_grid(C, max_T), st.integers(1, max_T))


@st.composite
def packed_lengths(draw, C: int, max_T: int):
    """2 to 4 packed sequences, total at most max_T. Each length is at or one off the chunk grid
    or anywhere, so boundaries fall on and off chunk boundaries; a length-1 sequence is put at
    the first, a middle or the last position. Bug classes: the state not reset at a sequence
    start, leaking across sequences (packed-state-leak), a length-1 sequence sharing a chunk with
    both neighbours, the initial state or its gradient of a sequence after the first."""
    n = draw(st.integers(2, 4))
    per = max(1, max_T // n)
    lens = [draw(st.one_of(st.just(1), length(C, per))) for _ in range(n)]
    where = draw(st.sampled_from(("none", "first", "middle", "last")))
    if where != "none":
        lens[{"first": 0, "middle": n // 2, "last": n - 1}[where]] = 1
    return tuple(lens)


@st.composite
def gate_params(draw, gate: str, C: int):
    """Parameters of `gate`, the default first (shrinking drops them). Strengths reach the
    overflow regime of masked-exp-overflow (|gamma| * C > 88.7: exp(g_i - g_j) overflows float32
    in the masked triangle, 0 * inf = NaN) and split-decay-overflow (the backward's dh through
    exp(-G)): stress magnitudes up to 4 per token (g_stress) or per head (gamma_stress, |gamma| * 128 up to
    768); logsigmoid gates down to norm 1 (the steepest); ALiBi slopes spread over layers."""
    if gate == "gamma_alibi":
        if not draw(st.booleans()):
            return {}
        layers = draw(st.integers(2, 24))
        return {"layers": layers, "layer": draw(st.integers(0, layers - 1))}
    if gate == "g_logsig":
        return draw(st.one_of(st.just({}), st.builds(lambda n: {"norm": n}, st.integers(1, 32))))
    if gate.endswith("stress"):
        # magnitudes past the overflow line for this chunk size are as likely as those below it
        steep = max(1, int(OVERFLOW_EXP // C) + 1)
        return draw(st.one_of(st.just({}), st.builds(lambda m: {"mag": m}, st.integers(1, max(4, steep)))))
    return {}


def head_dim(dims):
    """A head dim of `dims`: <= 32 (several heads per sublane tile: head index maps), one 128-lane
    tile, or more than one (wide-tile-overwrite: tiles overwritten past 128), a third of the time
    each, then any dim of that class (the tile edges 127, 128, 129, 136 among them)."""
    classes = [
        c for c in ([d for d in dims if d <= 32], [d for d in dims if 32 < d <= 128], [d for d in dims if d > 128]) if c
    ]
    return st.sampled_from(classes).flatmap(st.sampled_from)


@st.composite
def head_dims(draw, space: Space):
    """(K, V): equal half the time, else two independent head_dim draws (K != V both ways: a scale,
    BlockSpec, tile count or state layout taken from the wrong dim, as in wide-tile-overwrite). A
    draw where each choice is explicit: hypothesis left to itself repeats K as V most of the time."""
    K = draw(head_dim(space.k_dims))
    others = [d for d in space.v_dims if d != K]
    if K in space.v_dims and (not others or draw(st.booleans()) is False):
        return K, K
    return K, draw(head_dim(others))


def _largest_T(kw: dict, space: Space, cap: int) -> int:
    """The largest T <= cap whose case (kw with T) fits space.max_elements; 0 when none does.
    Input size is linear in T."""
    size = lambda T: input_size(Case(**{**kw, "T": T, "seqlens": None}))[0]
    per_token = size(2) - size(1)
    fixed = size(1) - per_token
    return max(0, min(cap, (space.max_elements - fixed) // max(1, per_token)))


@st.composite
def boundary_case(draw, space: Space, applies=None):
    """A valid Case of space.op aimed at chunked-kernel bugs (module docstring), within
    space.max_elements. `applies(case) -> bool`: draw only cases it accepts (where the
    candidate has a kernel; pairings the axes alone do not rule out are filtered).
    Biases and the bug class each is for:
      T              near_chunk_grid / length: one-token tails and off-by-one at chunk ends
      seqlens        packed_lengths: state reset and leaks, length-1 sequences anywhere
      K, V           head_dims: HEAD_DIMS by tile class (<= 32, one tile, two), K = V or K != V
                     half the time each (wide-tile-overwrite: tiles and layouts taken from the wrong dim)
      H              1 to max_H, H > 2 half the time (head index maps that wrap or assume two heads)
      h0             2 in 3 with packed sequences (a later sequence's initial state and its gradient)
      gate strength  gate_params (exp overflow: masked-exp-overflow, split-decay-overflow)."""
    op = space.op
    C = draw(st.sampled_from(space.chunk_sizes))
    dtype = draw(st.sampled_from(space.dtypes))
    direction = draw(st.sampled_from(space.directions))
    gate = draw(st.sampled_from(space.gates))
    params = draw(gate_params(gate, C))
    K, V = draw(head_dims(space))
    varlen = draw(st.sampled_from((False, True)))
    # packed sequences carry an initial state 2 times in 3 (the state and its gradient of a sequence
    # after the first: packed-state-leak, a dropped dh0 of a one-token last sequence)
    h0, ht = draw(st.sampled_from((False, True, True) if varlen else (False, True))), draw(st.booleans())
    kw = dict(
        op=op,
        B=1,
        T=1,
        H=1,
        K=K,
        V=V,
        dtype=dtype,
        chunk_size=C,
        gate=gate,
        gate_params=params,
        h0=h0,
        ht=ht,
        direction=direction,
    )
    # heads and batch only as far as one token still fits
    max_H = max(
        1,
        min(
            space.max_H,
            next((H for H in range(space.max_H, 0, -1) if _largest_T({**kw, "H": H}, space, space.max_T) >= 1), 1),
        ),
    )
    # H > 2 as often as any H (head index maps that wrap or assume two heads)
    kw["H"] = draw(st.one_of(st.integers(1, max_H), st.integers(min(3, max_H), max_H)))
    if not varlen and _largest_T({**kw, "B": 2}, space, space.max_T) >= 1:
        kw["B"] = draw(st.integers(1, 2))
    max_T = max(1, _largest_T(kw, space, space.max_T))
    if varlen and max_T >= 2:
        kw["seqlens"] = draw(packed_lengths(C, max_T))
        kw["T"] = sum(kw["seqlens"])
    else:
        kw["T"] = draw(length(C, max_T))
    kw["scale"] = draw(st.one_of(st.none(), st.sampled_from((0.05, 0.125, 1.0))))
    kw["seed"] = draw(st.integers(0, SEEDS - 1))
    c = Case(**kw)
    # rare: packed sequences multiply the state inputs (h0, dht) past the bound
    if not space.fits(c) or (applies is not None and not applies(c)):
        reject()
    return c


# ------------------------------------------------------------------ shape classes: cases that share a compiled program
def shape_class(case: Case) -> Case:
    """The representative of `case`'s shape class: every field a kernel's compiled program depends on
    (op, B, T, H, K, V, dtype, chunk size, direction, scale, h0, ht, packed lengths, and whether the
    gate is a per-token g or a per-head g_gamma) kept, the values set to their first (seed 0, the
    op's first gate of that kind, default parameters). Cases of one class differ only in their input
    values: a kernel called on both runs the same compiled program (jax's jit cache)."""
    gate = next(g for g, (ops, _) in GATES.items() if case.op in ops and g.startswith("gamma_") == case.uses_g_gamma)
    return case.replace(gate=gate, gate_params={}, seed=0)


@st.composite
def value_variant(draw, space: Space, case: Case):
    """A case of `case`'s shape class with new values: a gate of the same kind (g or g_gamma) in
    space.gates, its parameters (gate_params: the overflow regime included) and the input seed.
    `parity fuzz` runs these right after `case`, on the programs compiled for it."""
    gate = draw(st.sampled_from([g for g in space.gates if g.startswith("gamma_") == case.uses_g_gamma]))
    params = draw(gate_params(gate, case.chunk_size))
    return case.replace(gate=gate, gate_params=params, seed=draw(st.integers(0, SEEDS - 1)))


# ------------------------------------------------------------------ shrinking a failing case, field by field
def simpler(case: Case, space: Space):
    """Cases one step simpler than `case` (valid, within `space`), the cheapest to run and the
    largest reductions first: fwd only, B = 1, fewer and shorter packed sequences, fewer heads,
    smaller head dims, shorter T, smaller chunks, then float32, the first gate and default
    parameters, no scale, no state, seed 0. `parity fuzz` runs them after hypothesis's own
    shrinking, keeping the first that still fails (each is one case run: seconds, where
    hypothesis's generic shrinker spends many runs on one field)."""
    C, T = case.chunk_size, case.T

    def smaller(value, options, limit=3):
        """Up to `limit` values of `options` below `value`: the smallest ones, then the one just below."""
        below = sorted(o for o in options if o < value)
        return list(dict.fromkeys(below[: limit - 1] + below[-1:]))

    steps: list[dict] = []
    if case.direction != "fwd" and "fwd" in space.directions:
        steps.append(dict(direction="fwd"))
    if case.B > 1:
        steps.append(dict(B=1))
    if case.seqlens is not None:
        lens = list(case.seqlens)
        for i in range(len(lens)):  # drop one sequence (one left: unpacked)
            rest = lens[:i] + lens[i + 1 :]
            if rest:
                steps.append(dict(seqlens=tuple(rest) if len(rest) > 1 else None, T=sum(rest)))
        for i, n in enumerate(lens):  # shorten one
            for m in sorted({1, n // 2, n - C, n - 1}):
                if 1 <= m < n:
                    new = lens[:i] + [m] + lens[i + 1 :]
                    steps.append(dict(seqlens=tuple(new), T=sum(new)))
    if case.H > 1:
        steps += [dict(H=h) for h in smaller(case.H, range(1, case.H))]
    steps += [dict(K=k) for k in smaller(case.K, space.k_dims)]
    steps += [dict(V=v) for v in smaller(case.V, space.v_dims)]
    if case.seqlens is None:
        # T: the smallest lengths, one off the chunk grid, the same tail one chunk shorter, half
        steps += [dict(T=t) for t in sorted({1, 2, C - 1, C, C + 1, T % C + C, T - C, T // 2, T - 1}) if 1 <= t < T]
    steps += [dict(chunk_size=c) for c in smaller(C, space.chunk_sizes)]
    if case.dtype != space.dtypes[0]:
        steps.append(dict(dtype=space.dtypes[0]))
    if case.gate != space.gates[0]:
        steps.append(dict(gate=space.gates[0], gate_params={}))
    if case.gate_params:
        steps.append(dict(gate_params={}))
    for field, plain in (("scale", None), ("h0", False), ("ht", False), ("seed", 0)):
        if getattr(case, field) != plain:
            steps.append({field: plain})
    for kw in steps:
        try:
            c = case.replace(**kw)
        except ValueError:
            continue
        if space.fits(c):
            yield c


def shrink_greedily(case: Case, space: Space, fails, out_of_time=lambda: False) -> Case:
    """The first of simpler(case) that still `fails(case) -> bool`, again from there, until none
    does or `out_of_time()`: a case no single step of `simpler` reduces further."""
    best, improved = case, True
    while improved and not out_of_time():
        improved = False
        for c in simpler(best, space):
            if out_of_time():
                break
            if fails(c):
                best, improved = c, True
                break
    return best
