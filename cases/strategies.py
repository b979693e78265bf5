"""hypothesis strategies that build valid cases (invalid combinations are never drawn)
and shrink towards small ones: `case(op=...)`."""
from __future__ import annotations

from hypothesis import strategies as st

from .case import GATES, OPS, Case


@st.composite
def seqlens(draw, max_T: int = 256):
    """Packed sequence lengths (>= 1 each), total at most max_T."""
    n = draw(st.integers(1, 4))
    return tuple(draw(st.lists(st.integers(1, max_T // n), min_size=n, max_size=n)))


@st.composite
def case(draw, op: str | None = None, max_T: int = 256, dtypes=("float32", "bfloat16"),
         directions=("fwd", "fwdbwd"), kv=(16, 60, 64, 100, 128, 256, 512)):
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
    return Case(op=op, B=1 if lens else draw(st.integers(1, 2)), T=T, H=draw(st.integers(1, 4)),
                K=draw(st.sampled_from(kv)), V=draw(st.sampled_from(kv)), dtype=draw(st.sampled_from(dtypes)),
                chunk_size=draw(st.sampled_from([64, 128])), gate=gate, gate_params=params,
                scale=draw(st.one_of(st.none(), st.sampled_from([0.05, 0.125, 1.0]))),
                h0=draw(st.booleans()), ht=draw(st.booleans()), seqlens=lens, seed=draw(st.integers(0, 3)),
                direction=draw(st.sampled_from(directions)))
