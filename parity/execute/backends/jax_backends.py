"""Backends that call jax functions: the built-in Pallas kernels and users' jax candidates.

Both run on a TPU when one is present; elsewhere in TPU interpret mode
(`pltpu.force_tpu_interpret_mode()`) on an emulated TPU host: jax's platform questions
(`jax.default_backend()`, `jax.devices()`, ...) and its Pallas TPU queries (`pltpu.get_tpu_info()`,
...) answer as one TPU generation would (parity.execute.tpu_identity), so that a library takes
the path it takes on a TPU, stated in the record's `notes.tpu_identity`; what ran is read from the
program's jaxpr (parity.execute.pallas_paths: each pallas_call's path as the code chose it on that
host, or no pallas_call at all), stated in `notes.pallas`. Interpret-mode programs are compiled by
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
from parity.execute import compile_log, interpret_callbacks, pallas_paths, tpu_identity
from parity.execute.backends.base import CompileSubject, Execution
from parity.execute.backends.calling import (
    accepts,
    candidate_declines,
    candidate_function,
    candidate_kernel_call,
    check_candidate_supports,
    forward_case,
    forward_only,
    run_jax,
)
from parity.execute.backends.stage_calling import case_program, run_stage_jax
from parity.measure import tpu_numerics
from parity.model.kernels import claims_mosaic, pallas_kernel, pallas_location
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
def _on_the_tpu_host(emulate: bool, module: str | None = None):
    """Around a jax kernel's call: nothing on a TPU (`emulate` False); elsewhere the emulated TPU host
    (parity.execute.tpu_identity: jax's platform questions and Pallas's TPU queries answer as the
    target) and XLA:CPU's optimisations off (parity.execute.compile_log), all left on the way
    out. Yields a function of no argument that gives the record's notes: {} on a TPU, else the
    identity and the questions the candidate asked (and while its `module` was imported), the
    compile effort and the numerics model's decision of which dots ran on the vector unit, and
    from what (tpu_numerics.decision)."""
    if not emulate:
        yield dict
        return
    target, source = tpu_identity.interpret_target()
    compile_log.install()
    interpret_callbacks.install()
    with tpu_identity.tpu_host(target) as host, compile_log.optimisation(disabled=True):
        yield lambda: {
            "tpu_identity": tpu_identity.describe(target, source, host.asked, module),
            "interpret_compile": compile_log.interpret_effort(),
            "tpu_numerics": tpu_numerics.decision(),
        }


def _tpu_interpret_mode(forced: bool):
    """Every pallas_call in TPU interpret mode when `forced` (no TPU attached)."""
    if not forced:
        return contextlib.nullcontext()
    from jax.experimental.pallas import tpu as pltpu  # late: jax is heavy

    return pltpu.force_tpu_interpret_mode()


_PATHS: dict[tuple, list] = {}  # (implementation, fn, case without its seed, target) -> pallas_paths.traced


def _pallas_paths(fn: Callable, case: Case, implementation: str) -> list[tuple[str, str]]:
    """pallas_paths.traced of the case's program through fn, traced as the kernel's code runs on
    the emulated TPU host (the caller's context) but without forced interpret mode, so that each
    pallas_call's `interpret` is the code's own; once per shape in a process (a further seed of
    a case traces the same program)."""
    key = (implementation, fn, case.replace(seed=0), tpu_identity.interpret_target()[0])
    if key not in _PATHS:
        program, args = case_program(case, fn)
        _PATHS[key] = pallas_paths.traced(program, *args)
    return _PATHS[key]


def run_on_the_tpu_host(
    fn: Callable,
    case: Case,
    inputs: dict[str, np.ndarray],
    implementation: str,
    tpu_kernels: bool,
    module: str | None = None,
):
    """(tensors, seconds, notes) of fn on the case in TPU interpret mode on the emulated TPU host
    (on a TPU: compiled by Mosaic); notes as _on_the_tpu_host's, and "pallas": what ran
    (pallas_paths.describe), with "required": `tpu_kernels` (fn claims to be Pallas TPU kernels:
    a result whose program is not is never passed, parity.records.tpu_kernel_problem); `module`:
    a user's candidate's module (how its import's questions were answered is stated too)."""
    forced = not _tpu_present()  # asked here: inside the emulation jax answers "tpu"
    with _on_the_tpu_host(forced, module) as notes:
        with _tpu_interpret_mode(forced):
            tensors, seconds = (run_jax if case.stage is None else run_stage_jax)(fn, case, inputs)
        try:
            paths = pallas_paths.describe(_pallas_paths(fn, case, implementation), forced=forced)
        except Exception as e:  # noqa: BLE001 - fail closed: what ran is unknown
            paths = {"kernels": [], "ran": "unknown", "cause": f"what ran could not be read: {type(e).__name__}: {e}"}
        return tensors, seconds, {**notes(), "pallas": {**paths, "required": tpu_kernels}}


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
        module, function = pallas_location(self.name, case)
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
        return CompileSubject(fn, f"{fn.__module__}.{fn.__name__}", expect_mosaic=claims_mosaic(case))

    @staticmethod
    def execute(
        fn: Callable, case: Case, inputs: dict[str, np.ndarray], implementation: str, notes: dict | None = None
    ) -> Execution:
        """Call a kernels_jax kernel (or a variant of one) and record where it ran; it must run as
        Pallas TPU kernels, but for the stages kernels_jax computes in XLA (kernels.XLA_STAGES)."""
        numerics = _numerics()
        tensors, seconds, ran = run_on_the_tpu_host(fn, case, inputs, implementation, tpu_kernels=claims_mosaic(case))
        return Execution(
            tensors=tensors,
            platform=_platform(),
            implementation=implementation,
            versions=_versions(),
            kernel_time_s=seconds,
            numerics=numerics,
            notes={**ran, **(notes or {})},
        )


class JaxCandidate:
    """A user's jax function in FLA's convention, run in TPU interpret mode when no TPU.

    framework 'pallas' says it is a Pallas TPU kernel: its compiled TPU module must contain a
    Mosaic kernel; 'jax' is any jax code (plain XLA is fine). A function may say otherwise for
    itself with a `framework` attribute ("jax" or "pallas"): a library's stage module that is part
    Pallas, part plain JAX (`fn.framework = "jax"`) is judged function by function, each on its
    numbers, the plain-JAX ones labelled as XLA, never passed as kernels."""

    side = "candidate"

    def __init__(self, name: str, fn: Callable, spec: str, framework: str = "jax"):
        self.name, self.fn, self.spec, self.framework = name, fn, spec, framework

    def function(self, case: Case) -> Callable:
        """The function the candidate runs for `case` (calling.candidate_function)."""
        return candidate_function(self.fn, parse_backend_spec(self.spec), case)

    @property
    def module(self) -> str:
        """The candidate's module (parity.execute.isolation keeps what its import changed to its calls)."""
        return parse_backend_spec(self.spec).module_function()[0]

    def claims_tpu_kernels(self, fn: Callable) -> bool:
        """Whether fn must run as Pallas TPU kernels: its own `framework`, else the candidate's."""
        framework = getattr(fn, "framework", self.framework)
        if framework not in ("jax", "pallas"):
            raise ValueError(f"{getattr(fn, '__name__', fn)}.framework = {framework!r}: expected 'jax' or 'pallas'")
        return framework == "pallas"

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        fn = self.function(case)
        check_candidate_supports(fn, case)
        run_as, not_judged = forward_case(fn, case)
        numerics = _numerics()
        with candidate_declines():
            tensors, seconds, ran = run_on_the_tpu_host(
                fn,
                run_as,
                inputs,
                self.spec,
                tpu_kernels=self.claims_tpu_kernels(fn),
                module=parse_backend_spec(self.spec).module_function()[0],
            )
        return Execution(
            tensors=tensors,
            platform=_platform(),
            implementation=self.spec,
            versions=_versions(),
            kernel_time_s=seconds,
            numerics=numerics,
            notes={**ran, **({"not_judged": not_judged} if not_judged else {})},
        )

    def kernel_call(self, case: Case) -> KernelCall:
        """The candidate's function; chunk_size passed when it accepts one (calling.static_kwargs)."""
        return candidate_kernel_call("jax", parse_backend_spec(self.spec), self.function(case), case)

    def compile_subject(self, case: Case) -> CompileSubject:
        fn = self.function(case)
        check_candidate_supports(fn, case)
        return CompileSubject(fn, self.spec, expect_mosaic=self.claims_tpu_kernels(fn), forward_only=forward_only(fn))
