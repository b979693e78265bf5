"""Backends that call jax functions: the built-in Pallas kernels and users' jax candidates.

Both run on a TPU when one is present; elsewhere inside TPU interpret mode
(`pltpu.force_tpu_interpret_mode()` for users' kernels; kernels_jax's choose it themselves,
kernels_jax.common.platform.interpret_mode), so third-party Pallas TPU kernels run unchanged on
CPU, with jax's TPU queries (`pltpu.get_tpu_info()`, ...) answering as one TPU generation would
(parity.execute.tpu_identity), stated in the record's `notes.tpu_identity`, and compiled by
XLA:CPU with most optimisations off and its elemental emitter (parity.execute.compile_log: about a
quarter of the compile time at XLA's defaults), stated in `notes.interpret_compile`; the
interpreter's own callbacks get numpy arrays without a round trip through jax Arrays
(parity.execute.interpret_callbacks: a quarter of a compiled kernel's run time, the same bits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np

from cases import Case
from parity.execute import compile_log, interpret_callbacks, tpu_identity
from parity.execute.backends.base import CompileSubject, Execution
from parity.execute.backends.calling import (
    accepts,
    candidate_declines,
    check_candidate_supports,
    forward_case,
    forward_only,
    run_jax,
)
from parity.measure import tpu_numerics
from parity.model.kernels import PALLAS_KERNELS, pallas_kernel
from parity.model.spec import KernelCall, Unsupported, parse_backend_spec


def _tpu_present() -> bool:
    # late: kernels_jax.common.platform imports jax (heavy), only when a jax backend runs
    from kernels_jax.common.platform import on_tpu

    return on_tpu()


def _platform() -> str:
    # late: kernels_jax.common.platform imports jax (heavy), only when a jax backend runs
    from kernels_jax.common.platform import platform_name

    return platform_name()


def _numerics() -> str:
    """The TPU numerics model this process computes jax dots under (on a TPU: the TPU itself)."""
    if _tpu_present():
        return "tpu"
    return tpu_numerics.active()


@contextlib.contextmanager
def _interpreting(force: bool):
    """Around a jax kernel's call: nothing on a TPU; elsewhere TPU interpret mode (forced when
    `force`: a user's kernel) with the emulated TPU identity (parity.execute.tpu_identity) and
    XLA:CPU's optimisations off (parity.execute.compile_log), all left on the way out. Yields the
    record's notes: {} on a TPU, else the identity, the compile effort and the numerics model's
    decision of which dots ran on the vector unit, and from what (tpu_numerics.decision:
    {"tpu_identity": ..., "interpret_compile": ..., "tpu_numerics": ...})."""
    if _tpu_present():
        yield {}
        return
    from jax.experimental.pallas import tpu as pltpu  # late: jax is heavy

    target, source = tpu_identity.interpret_target()
    compile_log.install()
    interpret_callbacks.install()
    with (
        pltpu.force_tpu_interpret_mode() if force else contextlib.nullcontext(),
        tpu_identity.emulated(target),
        compile_log.optimisation(disabled=True),
    ):
        yield {
            "tpu_identity": tpu_identity.describe(target, source),
            "interpret_compile": compile_log.interpret_effort(),
            "tpu_numerics": tpu_numerics.decision(),
        }


def _versions() -> dict[str, str]:
    import jax
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}


class PallasBackend:
    """kernels_jax: `pallas` (chunked) or `pallas-fused` (Simple GLA g_gamma fused path)."""

    side = "candidate"

    def __init__(self, name: str = "pallas"):
        self.name = name

    def kernel(self, case: Case) -> Callable:
        return pallas_kernel(self.name, case)

    def kernel_call(self, case: Case) -> KernelCall:
        """The kernels_jax entry point for the case; chunk_size passed when it accepts one."""
        fn = self.kernel(case)
        module, function = PALLAS_KERNELS[self.name][case.op]
        return KernelCall("jax", module, function, case.chunk_size if accepts(fn, "chunk_size") else None)

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        fn = self.kernel(case)
        return self.execute(fn, case, inputs, implementation=f"{fn.__module__}.{fn.__name__}")

    def applies_to_any(self, cases) -> bool:
        """Whether kernels_jax has a kernel for at least one of the cases."""
        for case in cases:
            try:
                self.kernel(case)
                return True
            except Unsupported:
                continue
        return False

    def compile_subject(self, case: Case) -> CompileSubject:
        fn = self.kernel(case)
        return CompileSubject(fn, f"{fn.__module__}.{fn.__name__}")

    @staticmethod
    def execute(
        fn: Callable, case: Case, inputs: dict[str, np.ndarray], implementation: str, notes: dict | None = None
    ) -> Execution:
        """Call a kernels_jax kernel (or a variant of one) and record where it ran."""
        numerics = _numerics()
        with _interpreting(force=False) as identity:
            tensors, seconds = run_jax(fn, case, inputs)
        return Execution(
            tensors=tensors,
            platform=_platform(),
            implementation=implementation,
            versions=_versions(),
            kernel_time_s=seconds,
            numerics=numerics,
            notes={**identity, **(notes or {})},
        )


class JaxCandidate:
    """A user's jax function in FLA's convention, run in TPU interpret mode when no TPU.

    framework 'pallas' says it is a Pallas TPU kernel: its compiled TPU module must contain a
    Mosaic kernel; 'jax' is any jax code (plain XLA is fine)."""

    side = "candidate"

    def __init__(self, name: str, fn: Callable, spec: str, framework: str = "jax"):
        self.name, self.fn, self.spec, self.framework = name, fn, spec, framework

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        check_candidate_supports(self.fn, case)
        run_as, not_judged = forward_case(self.fn, case)
        numerics = _numerics()
        with _interpreting(force=True) as identity, candidate_declines():
            tensors, seconds = run_jax(self.fn, run_as, inputs)
        return Execution(
            tensors=tensors,
            platform=_platform(),
            implementation=self.spec,
            versions=_versions(),
            kernel_time_s=seconds,
            numerics=numerics,
            notes={**identity, **({"not_judged": not_judged} if not_judged else {})},
        )

    def kernel_call(self, case: Case) -> KernelCall:
        """The candidate's function; chunk_size passed when it accepts one (calling.static_kwargs)."""
        module, function = parse_backend_spec(self.spec).module_function()
        return KernelCall("jax", module, function, case.chunk_size if accepts(self.fn, "chunk_size") else None)

    def compile_subject(self, case: Case) -> CompileSubject:
        check_candidate_supports(self.fn, case)
        return CompileSubject(
            self.fn, self.spec, expect_mosaic=self.framework == "pallas", forward_only=forward_only(self.fn)
        )
