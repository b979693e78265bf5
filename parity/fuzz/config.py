"""What a `parity fuzz` search is given (FuzzConfig) and the case space it draws from: the op's
Space narrowed to where the subject has a kernel (applies_predicate, space_for)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cases import Case
from cases.strategies import Space
from parity.execute.backends import Unsupported, backend_name, make_backend
from parity.execute.backends.jax_backends import PallasBackend
from parity.execute.backends.mutant import MutantBackend
from parity.model.spec import REFERENCE

DEFAULT_MAX_ELEMENTS = 2**18  # a few seconds per example in TPU interpret mode on a CPU
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_SHRINK_TIME_S = 300.0
# value variants run after each drawn case, on the programs compiled for it (cases.strategies.value_variant):
# a new shape class costs its XLA compiles (2-9 s in TPU interpret mode on a 2-core CPU), a variant
# 0.1-1 s (the program's run alone). At most `variants`, while their time stays under `variant_share` x
# the drawn case's own. Off by default: measured on simple_gla (T <= 256, 2 cores), 16 variants at
# share 1 run 54 examples of 13 shape classes in 63 s (0.86/s) against 24 in 61 s (0.39/s) without
# (repeated draws, which the search judges from memory, `cache_hits`, not counted), but new shape
# classes come at a lower rate, and
# the narrow shape bugs (parity.mutants.narrow) are found later or, within tests/test_fuzz.py's
# budgets, not at all; variants are for value-triggered bugs (gate strength, seeds) on the shapes drawn.
DEFAULT_VARIANTS = 0
DEFAULT_VARIANT_SHARE = 1.0


@dataclasses.dataclass
class FuzzConfig:
    out: Path
    ops: tuple[str, ...]
    backends: tuple[str, ...] = ("oracle",)  # oracle first; with 'fla' the bound is enforced
    candidate: str | None = None  # the spec searched; None: the reference itself
    time_s: float = 60.0  # per op and search, to draw examples
    shrink_time_s: float = DEFAULT_SHRINK_TIME_S
    max_examples: int = 10**6
    seed: int = 0
    jobs: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_elements: int = DEFAULT_MAX_ELEMENTS
    factor: float = 1.0
    progress: bool = True
    numerics: str = ""  # TPU numerics model of jax candidates ("" = default), as parity run
    space: dict = dataclasses.field(default_factory=dict)  # Space fields to fix (tests: directions=("fwd",))
    variants: int = DEFAULT_VARIANTS  # value variants per drawn case at most, on its compiled programs; 0: none
    variant_share: float = DEFAULT_VARIANT_SHARE  # their time at most, as a share of the drawn case's

    def __post_init__(self):
        if isinstance(self.variants, bool) or not isinstance(self.variants, int) or self.variants < 0:
            raise ValueError(f"FuzzConfig.variants={self.variants!r}: expected an int >= 0")
        if not (isinstance(self.variant_share, (int, float)) and 0 <= self.variant_share < float("inf")):
            raise ValueError(f"FuzzConfig.variant_share={self.variant_share!r}: expected a finite number >= 0")

    @property
    def specs(self) -> list[str]:
        return ["oracle"] + [s for s in self.backends if s != "oracle"] + ([self.candidate] if self.candidate else [])

    @property
    def subject(self) -> str:
        """The backend name whose verdict is the property."""

        return backend_name(self.candidate) if self.candidate else REFERENCE


# ------------------------------------------------------------------ where the subject applies
def applies_predicate(spec: str):
    """case -> bool: whether the backend has a kernel for the case (None: it does not say).
    Built-in kernels and mutants answer through compile_subject (Unsupported); a candidate
    function through its `applies` attribute, if it has one."""

    if spec in ("oracle", REFERENCE):
        return None
    backend = make_backend(spec)
    fn_applies = getattr(getattr(backend, "fn", None), "applies", None)
    if callable(fn_applies):
        return fn_applies
    if not isinstance(backend, (PallasBackend, MutantBackend)):
        return None

    def applies(case: Case) -> bool:
        try:
            backend.compile_subject(case)
        except Unsupported:
            return False
        return True

    return applies


def space_for(op: str, applies, max_elements: int, **fixed) -> Space:
    """The Space of `op` narrowed, axis by axis, to the values `applies` accepts (probed on a
    small case); ValueError naming the op when it accepts none. `fixed` overrides fields."""
    base = Space(op=op, max_elements=max_elements, **fixed)
    if applies is None:
        return base
    probe = next(
        (Case(op, 1, 16, 1, 64, 64, gate=g) for g in base.gates if applies(Case(op, 1, 16, 1, 64, 64, gate=g))), None
    )
    if probe is None:
        raise ValueError(f"the candidate has no kernel for op {op!r} at any gate (probed at K = V = 64)")
    ok = lambda **kw: applies(probe.replace(**kw))
    fields = dict(
        gates=tuple(g for g in base.gates if ok(gate=g)),
        dtypes=tuple(d for d in base.dtypes if ok(dtype=d)),
        k_dims=tuple(d for d in base.k_dims if ok(K=d)),
        v_dims=tuple(d for d in base.v_dims if ok(V=d)),
        chunk_sizes=tuple(c for c in base.chunk_sizes if ok(chunk_size=c)),
    )
    empty = [f for f, v in fields.items() if not v]
    if empty:
        raise ValueError(f"the candidate has no kernel for op {op!r}: no value of {', '.join(empty)} is accepted")
    return dataclasses.replace(base, **fields)
