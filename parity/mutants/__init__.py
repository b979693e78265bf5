"""Mutants: kernels_jax kernels with known bugs, to prove the harness catches wrong kernels.
Layer: above the model, below execution (they are test subjects, run as candidates).

    catalogue.py   the seed documents' bug classes, the Mutant dataclass and the suite mutants (the
                   named suites must catch each)
    narrow.py      the narrow mutants (wrong only outside every named suite: `parity fuzz` finds them)
    order.py       the order a mutant tries a selection's cases in (witness first, then most alike)
    patched.py     a mutant's own copy of kernels_jax with its patches applied (its kernel)
The backend that runs `mutant:NAME` is parity.execute.backends.mutant, registered like any backend;
`parity mutants` (parity.mutation) runs them through the gate and scores what caught each.
"""

import dataclasses
import json

from parity.mutants.catalogue import BUG_CLASSES, SUITE_MUTANTS, BugClass, Mutant
from parity.mutants.narrow import NARROW_MUTANTS

CATALOGUE: tuple[Mutant, ...] = SUITE_MUTANTS + NARROW_MUTANTS
BY_NAME = {m.name: m for m in CATALOGUE}


def _listed(m: Mutant) -> dict:
    """A mutant as `parity mutants --list` shows it: its fields but `wrap`, its bug class given as
    its seed document's number ("seed")."""
    out = {}
    for k, v in dataclasses.asdict(m).items():
        if k == "bug":
            out["seed"] = m.seed
        elif k != "wrap":
            out[k] = v
    return out


def catalogue_json() -> str:
    return json.dumps([_listed(m) for m in CATALOGUE], indent=1)


__all__ = ["BUG_CLASSES", "BY_NAME", "CATALOGUE", "BugClass", "Mutant", "catalogue_json"]
