"""The order in which `parity mutants` tries a selection's cases on a mutant: its witness first
when the selection holds it, then the cases most like the witness, so that the run can stop at
the first case that catches it (parity.mutation).

Likeness is a weighted sum over the case fields a mutant's trigger is made of, compared with its
witness (`NEEDS`, `LIKENESS`): what the witness turns on, a case must have too to trigger the same
bug (backward, h0, ht, packed sequences, a g_gamma gate, K != V), so only a case that has it too
scores for it; other fields score when they agree (the gate, the chunk size, the dtype, K and V,
the direction, then T, B and H). Ties go to the cheaper case (forward before backward, fewer
elements), then to the selection's order. Only cases of the mutant's op are tried: the mutated
kernel has no other.
"""

from __future__ import annotations

from collections.abc import Callable

from cases import Case
from parity.mutants.catalogue import Mutant

# a flag the witness has on -> weight of the case having it on too
NEEDS: dict[str, tuple[float, Callable[[Case], bool]]] = {
    "backward": (4.0, lambda c: c.backward),
    "h0": (4.0, lambda c: c.h0),
    "ht": (4.0, lambda c: c.ht),
    "varlen": (4.0, lambda c: c.seqlens is not None),
    "g_gamma": (4.0, lambda c: c.uses_g_gamma),
    "K!=V": (4.0, lambda c: c.K != c.V),
}
# a field -> weight of the case agreeing with the witness on it
LIKENESS: dict[str, tuple[float, Callable[[Case], object]]] = {
    "gate": (4.0, lambda c: c.gate),
    "chunk_size": (3.0, lambda c: c.chunk_size),
    "dtype": (3.0, lambda c: c.dtype),
    "K": (2.0, lambda c: c.K),
    "V": (2.0, lambda c: c.V),
    "direction": (1.0, lambda c: c.direction),
    "T": (1.0, lambda c: c.T),
    "B": (0.5, lambda c: c.B),
    "H": (0.5, lambda c: c.H),
}


def likeness(case: Case, witness: Case) -> float:
    """How much `case` looks like `witness`: the NEEDS weights of the witness's flags the case
    has too, plus the LIKENESS weights of the fields on which they agree."""
    needs = sum(w for w, flag in NEEDS.values() if flag(witness) and flag(case))
    return needs + sum(w for w, field in LIKENESS.values() if field(case) == field(witness))


def cost(case: Case) -> tuple[bool, int]:
    """A rough order of a case's cost: forward before backward, then its input elements."""
    return case.backward, case.B * case.T * case.H * (case.K + case.V)


def case_order(mutant: Mutant, cases: list[Case]) -> list[Case]:
    """The cases of `mutant`'s op among `cases`, in the order to try them: the witness (if
    there), then most like the witness first; ties by cost, then by position in `cases`."""
    witness = Case.from_id(mutant.witness) if mutant.witness else None
    own = [(i, c) for i, c in enumerate(cases) if c.op == mutant.op]
    if witness is None:
        return [c for _, c in own]
    ranked = sorted(own, key=lambda ic: (ic[1] != witness, -likeness(ic[1], witness), cost(ic[1]), ic[0]))
    return [c for _, c in ranked]
