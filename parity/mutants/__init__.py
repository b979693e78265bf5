"""Mutants: kernels_jax kernels with known bugs, to prove the harness catches wrong kernels.

    catalogue.py   the Mutant dataclass and CATALOGUE (imports nothing of the harness)
    narrow.py      the narrow mutants (wrong only outside every named suite: `parity fuzz` finds them)
    run.py         `parity mutants`: run them through the gate and score what caught each
The backend that runs `mutant:NAME` is parity.backends.mutant, registered like any backend.
"""

from .catalogue import BY_NAME, CATALOGUE, Mutant, catalogue_json

__all__ = ["BY_NAME", "CATALOGUE", "Mutant", "catalogue_json", "format_score", "run_mutants", "score"]


def __getattr__(name: str):
    """score, format_score and run_mutants from parity.mutants.run, imported on first use (it
    imports the runner; the catalogue must not)."""
    if name in ("score", "format_score", "run_mutants"):
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module 'parity.mutants' has no attribute {name!r}")
