"""Mutants: kernels_jax kernels with known bugs, to prove the harness catches wrong kernels.
Layer: above the model, below execution (they are test subjects, run as candidates).

    catalogue.py   the Mutant dataclass and the suite mutants (the named suites must catch each)
    narrow.py      the narrow mutants (wrong only outside every named suite: `parity fuzz` finds them)
    order.py       the order a mutant tries a selection's cases in (witness first, then most alike)
    patched.py     a mutant's own copy of kernels_jax with its patches applied (its kernel)
The backend that runs `mutant:NAME` is parity.execute.backends.mutant, registered like any backend;
`parity mutants` (parity.cli.mutants) runs them through the gate and scores what caught each.
"""

import dataclasses
import json

from parity.mutants.catalogue import SUITE_MUTANTS, Mutant
from parity.mutants.narrow import NARROW_MUTANTS

CATALOGUE: tuple[Mutant, ...] = SUITE_MUTANTS + NARROW_MUTANTS
BY_NAME = {m.name: m for m in CATALOGUE}


def catalogue_json() -> str:
    return json.dumps([{k: v for k, v in dataclasses.asdict(m).items() if k != "wrap"} for m in CATALOGUE], indent=1)


__all__ = ["BY_NAME", "CATALOGUE", "Mutant", "catalogue_json"]
