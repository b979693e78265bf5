"""`noise:REL`: a test subject whose compute error is known (the candidates of `parity power`). Its result is
the exact one (the float64 oracle) plus Gaussian noise of relative rms REL added before the final
rounding to the output dtype, on every tensor the case returns in a low-precision dtype (bfloat16
or float16); its float32 tensors are the oracle rounded to float32. A candidate with REL = 1.25 x
the reference's compute error on those tensors must fail the gate, one with 0.9 x must pass."""

from __future__ import annotations

import hashlib

import numpy as np

from cases import Case
from parity.execute.backends.base import Execution
from parity.execute.backends.oracle import cached_oracle
from parity.measure.compute_error import noisy
from parity.measure.tol import NP_DTYPES, output_dtype
from parity.model.spec import BackendSpec, KernelCall
from references import error_scales


class NoiseBackend:
    """noise:REL (module docstring); `rel` per tensor overrides REL (tests: a reference-side twin)."""

    def __init__(self, spec: BackendSpec, rel: dict[str, float] | None = None):
        self.name, self.side = spec.name, spec.side
        self.default = float(spec.implementation)
        self.rel = rel or {}

    def kernel_call(self, case: Case) -> KernelCall:
        raise ValueError(f"{self.name} is the oracle plus noise, not a kernel: rerun it with parity run")

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        full = cached_oracle(case, inputs)[0]
        scales = error_scales(full)
        out = {}
        for n in case.output_names():
            dt = output_dtype(case, n)
            rel = self.rel.get(n, self.default if dt != "float32" else 0.0)
            key = hashlib.sha256(f"{self.name}/{case.seed}/{n}".encode()).digest()[:8]
            rng = np.random.default_rng(int.from_bytes(key, "little"))
            out[n] = noisy(full[n], rel, NP_DTYPES[dt], rng, scales.get(n))
        return Execution(
            tensors=out,
            platform="cpu:float64-oracle+noise",
            implementation=f"exact result + Gaussian noise, relative rms {self.default:g} on low-precision outputs",
            versions={},
            numerics="float64+noise",
            notes={"no_tpu_program": "the oracle plus noise: nothing to compile for a TPU"},
        )
