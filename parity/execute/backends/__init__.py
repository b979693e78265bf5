"""Backends: oracle (float64), fla (FLA Triton), pallas / pallas-fused (kernels_jax), mutant:NAME
(parity.mutants) and user candidates NAME=FRAMEWORK:MODULE:FUNCTION (FRAMEWORK jax, pallas or
torch). A spec is parsed once (parity.model.spec.parse_backend_spec) into a BackendSpec;
`make_backend(spec)` builds its backend (in a worker process, from the spec)."""

from __future__ import annotations

import importlib
import os
import sys

from parity.execute import isolation, tpu_identity
from parity.execute.backends.base import Backend, BackendResult, CompileSubject, Execution, execute

# every backend module is light at import: jax, torch, triton and fla load when a backend runs
from parity.execute.backends.fla import FlaBackend
from parity.execute.backends.jax_backends import JaxCandidate, PallasBackend
from parity.execute.backends.mutant import MutantBackend
from parity.execute.backends.noise import NoiseBackend
from parity.execute.backends.oracle import OracleBackend
from parity.execute.backends.torch_candidate import TorchCandidate
from parity.execute.proc import call_in_child
from parity.model.host import tpu_attached
from parity.model.spec import (
    BUILTIN,
    CANDIDATE_FORM,
    FRAMEWORKS,
    MUTANT_PREFIX,
    NAME_RE,
    REFERENCE,
    BackendSpec,
    KernelCall,
    SpecError,
    Unsupported,
    as_spec,
    parse_backend_spec,
)
from parity.mutants import BY_NAME


def parse_candidate(text: str) -> tuple[str, str, str, str]:
    """(name, framework, module, function) of a candidate spec NAME=FRAMEWORK:MODULE:FUNCTION."""
    spec = parse_backend_spec(text) if "=" in str(text) else None
    if spec is None or not spec.is_candidate_spec:
        raise SpecError("candidate", text, CANDIDATE_FORM)
    return (spec.name, spec.framework, *spec.module_function())


def load_candidate_function(spec: BackendSpec | str):
    """The candidate's function (its module, for a stage module MODULE:*), imported (from the
    working directory too); SpecError naming
    the spec when its module cannot be imported or has no such function. A jax candidate's
    module is imported on the emulated TPU host (parity.execute.tpu_identity, where no TPU is
    attached): a library that fixes its path at import (a config's default built from
    `jax.default_backend()`) fixes the TPU's."""
    spec = as_spec(spec)
    module, func = spec.module_function()
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:  # what the import changes in the process applies to this candidate's calls alone
        mod = isolation.imported(module, lambda: _import_on_the_tpu_host(spec, module))
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module
        problem = f"cannot import module {module!r}: {type(e).__name__}: {e}"
        raise SpecError("candidate", spec.text, "", problem) from None
    if spec.is_stage_module:
        return mod
    fn = getattr(mod, func, None)
    if not callable(fn):
        raise SpecError("candidate", spec.text, "", f"module {module!r} has no function {func!r}")
    return fn


def _import_on_the_tpu_host(spec: BackendSpec, module: str):
    """The candidate's module, imported on the emulated TPU host (the target TPU interpret mode
    emulates) for a jax or pallas candidate where no TPU is attached, noting how its import's
    questions were answered (tpu_identity.imported: a module imported before, by a test file
    say, was answered by this machine); plainly otherwise."""
    if spec.framework not in ("jax", "pallas") or tpu_attached():
        return importlib.import_module(module)
    if module in sys.modules:
        tpu_identity.imported(module, None)
        return sys.modules[module]
    with tpu_identity.tpu_host(tpu_identity.interpret_target()[0]) as host:
        mod = importlib.import_module(module)
    tpu_identity.imported(module, host)
    return mod


def backend_name(spec: BackendSpec | str) -> str:
    return as_spec(spec).name


def make_backend(spec: BackendSpec | str) -> Backend:
    """The backend of a spec (a candidate's module is imported here)."""
    spec = as_spec(spec)
    if spec.kind == "oracle":
        return OracleBackend()
    if spec.kind == "fla":
        return FlaBackend()
    if spec.kind == "kernels_jax":
        return PallasBackend(spec.name)
    if spec.kind == "mutant":
        return MutantBackend(spec)
    if spec.kind == "noise":
        return NoiseBackend(spec)
    fn = load_candidate_function(spec)
    if spec.framework in ("jax", "pallas"):
        return JaxCandidate(spec.name, fn, spec.text, framework=spec.framework)
    return TorchCandidate(spec.name, fn, spec.text)


def parse_specs(texts: list[str]) -> list[BackendSpec]:
    """Every spec parsed, no backend name twice; SpecError otherwise. Nothing is imported."""
    specs, seen = [], set()
    for text in texts:
        spec = as_spec(text)
        if spec.kind == "mutant" and spec.implementation not in BY_NAME:
            raise SpecError("backends", spec.text, f"mutant:NAME with NAME one of {sorted(BY_NAME)}", "unknown mutant")
        if spec.name in seen:
            raise SpecError("backends", spec.name, "each backend once", f"backend {spec.name!r} given twice")
        seen.add(spec.name)
        specs.append(spec)
    return specs


def check_specs(texts: list[str]) -> list[BackendSpec]:
    """parse_specs, and every candidate's function imported, before any case runs."""
    specs = parse_specs(texts)
    for spec in specs:
        if spec.is_candidate_spec:
            load_candidate_function(spec)
    return specs


def _check_specs_message(texts: list[str]) -> tuple | None:
    """check_specs's refusal as SpecError's arguments (they cross the process boundary), or None."""
    try:
        check_specs(texts)
    except SpecError as e:
        return e.args
    return None


def check_specs_isolated(texts: list[str], timeout_s: float) -> list[BackendSpec]:
    """check_specs, with the candidates' modules imported in a child process (parity.execute.proc), so
    that a module that hangs or ends the process at import is refused, not fatal."""
    specs = parse_specs(texts)
    if not any(s.is_candidate_spec for s in specs):
        return specs
    status, value = call_in_child(_check_specs_message, ([s.text for s in specs],), timeout_s)
    if status == "timeout":
        raise SpecError(
            "candidate",
            None,
            f"modules that import within {timeout_s:g} s ({{timeout}})",
            f"importing the candidate modules of {[s.text for s in specs]} did not finish within {timeout_s:g} s",
        )
    if status == "died":
        raise SpecError(
            "candidate",
            None,
            "",
            f"importing the candidate modules of {[s.text for s in specs]} ended the process (exit code {value})",
        )
    if value:
        raise SpecError(*value)
    return specs


__all__ = [
    "Backend",
    "BackendResult",
    "BackendSpec",
    "CompileSubject",
    "Execution",
    "KernelCall",
    "Unsupported",
    "execute",
    "make_backend",
    "check_specs",
    "check_specs_isolated",
    "backend_name",
    "parse_backend_spec",
    "parse_candidate",
    "parse_specs",
    "as_spec",
    "SpecError",
    "BUILTIN",
    "FRAMEWORKS",
    "MUTANT_PREFIX",
    "NAME_RE",
    "REFERENCE",
]
