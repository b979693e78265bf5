"""`mutant:NAME`: a kernels_jax kernel with a known bug (parity.mutants) as a candidate."""

from __future__ import annotations

import numpy as np

from cases import Case
from parity.execute.backends.base import CompileSubject, Execution
from parity.execute.backends.jax_backends import PallasBackend
from parity.model.kernels import claims_mosaic
from parity.model.spec import BackendSpec, KernelCall, Unsupported
from parity.mutants import BY_NAME
from parity.mutants.patched import mutant_kernel


class MutantBackend:
    """`mutant:NAME`: the mutated kernel as a candidate."""

    side = "candidate"

    def __init__(self, spec: BackendSpec):
        self.mutant = BY_NAME[spec.implementation]
        self.name = spec.name

    def kernel_call(self, case: Case) -> KernelCall:
        raise ValueError(
            f"{self.name} is the {self.mutant.impl} kernel with a planted bug (parity.mutants), not a standalone "
            f"kernel: repro the {self.mutant.impl} kernel"
        )

    def compile_subject(self, case: Case) -> CompileSubject:
        """The mutated kernel, for the TPU compile check: from the mutant's copy of kernels_jax
        (parity.mutants.patched), its module named after the mutant."""
        m = self.mutant
        if case.op != m.op:
            raise Unsupported(f"{self.name} mutates the {m.op} kernel")
        fn = mutant_kernel(m, case)
        return CompileSubject(
            m.wrap(fn) if m.wrap else fn,
            f"{fn.__module__}.{fn.__name__} with mutation {m.name}",
            expect_mosaic=claims_mosaic(case),
        )

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        subject = self.compile_subject(case)
        return PallasBackend.execute(
            subject.fn, case, inputs, implementation=subject.implementation, notes={"mutant": self.mutant.name}
        )
