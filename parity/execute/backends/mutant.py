"""`mutant:NAME`: a kernels_jax kernel with a known bug (parity.mutants) as a candidate."""

from __future__ import annotations

import functools

import numpy as np

from cases import Case
from parity.execute.backends.base import CompileSubject, Execution
from parity.execute.backends.jax_backends import PallasBackend
from parity.model.spec import BackendSpec, KernelCall, Unsupported
from parity.mutants import BY_NAME


class MutantBackend:
    """`mutant:NAME`: the mutated kernel as a candidate."""

    side = "candidate"

    def __init__(self, spec: BackendSpec):
        self.mutant = BY_NAME[spec.implementation]
        self.name = spec.name

    def kernel_call(self, case: Case) -> KernelCall:
        raise ValueError(
            f"{self.name} is a switch inside kernels_jax, not a standalone kernel: "
            f"repro the {self.mutant.impl} kernel with the switch {self.mutant.switch!r} on"
        )

    def compile_subject(self, case: Case) -> CompileSubject:
        """The mutated kernel and the switch it is traced under, for the TPU compile check."""
        # late: kernels_jax imports jax (heavy), only when a mutant is compiled or run
        from kernels_jax.common import mutation

        m = self.mutant
        if case.op != m.op:
            raise Unsupported(f"{self.name} mutates the {m.op} kernel")
        fn = PallasBackend(m.impl).kernel(case)
        return CompileSubject(
            m.wrap(fn) if m.wrap else fn,
            f"{fn.__module__}.{fn.__name__} with mutation {m.name}",
            context=functools.partial(mutation.enabled, *([m.switch] if m.switch else [])),
        )

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        subject = self.compile_subject(case)
        with subject.context():
            return PallasBackend.execute(
                subject.fn, case, inputs, implementation=subject.implementation, notes={"mutant": self.mutant.name}
            )
