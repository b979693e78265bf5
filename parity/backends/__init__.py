"""Backends: oracle (float64), fla (FLA Triton), pallas / pallas-fused (kernels_jax), and
user candidates given as NAME=FRAMEWORK:MODULE:FUNCTION (FRAMEWORK is jax, pallas or torch).

Backends are named by strings so that worker processes can build them: `make_backend(spec)`.
"""
from __future__ import annotations

import importlib
import os
import re
import sys

from .base import Backend, BackendResult, CompileSubject, Execution, Unsupported, execute

BUILTIN = ("oracle", "fla", "pallas", "pallas-fused")
# jax: any jax code; pallas: a Pallas TPU kernel (its TPU module must hold a Mosaic kernel); torch
FRAMEWORKS = ("jax", "pallas", "torch")
MUTANT_PREFIX = "mutant:"   # mutant:NAME, a kernels_jax kernel with a known bug (parity.mutants)
# a backend's name is a folder of the output directory: a safe charset, no path components
# ('.', '..', '/', a leading '-' or '.'), at most 64 characters
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
CANDIDATE_RE = re.compile(r"^(?P<name>[^=]*)=(?P<fw>[a-z]+):(?P<module>[A-Za-z0-9_.]+):(?P<func>[A-Za-z0-9_]+)$")


class SpecError(ValueError):
    """A backend or candidate spec that cannot be used; the message is one line."""


def parse_candidate(spec: str) -> tuple[str, str, str, str]:
    m = CANDIDATE_RE.match(spec)
    if not m:
        raise SpecError(f"--candidate {spec!r}: expected NAME=FRAMEWORK:MODULE:FUNCTION, e.g. mine=jax:my_pkg.kernels:chunk_gla")
    if not NAME_RE.fullmatch(m["name"]):
        raise SpecError(f"--candidate {spec!r}: NAME {m['name']!r} is not allowed: expected 1 to 64 of "
                        "A-Z a-z 0-9 _ . + -, starting with a letter or digit")
    if m["fw"] not in FRAMEWORKS:
        raise SpecError(f"--candidate {spec!r}: FRAMEWORK {m['fw']!r} is not one of {list(FRAMEWORKS)}")
    if m["name"] in BUILTIN:
        raise SpecError(f"--candidate {spec!r}: NAME {m['name']!r} is taken by a built-in backend {list(BUILTIN)}")
    return m["name"], m["fw"], m["module"], m["func"]


def load_candidate_function(spec: str):
    name, fw, module, func = parse_candidate(spec)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module
        raise SpecError(f"--candidate {spec!r}: cannot import module {module!r}: {type(e).__name__}: {e}") from None
    fn = getattr(mod, func, None)
    if not callable(fn):
        raise SpecError(f"--candidate {spec!r}: module {module!r} has no function {func!r}")
    return name, fw, fn


def backend_name(spec: str) -> str:
    if spec in BUILTIN:
        return spec
    if spec.startswith(MUTANT_PREFIX):
        return "mutant-" + spec[len(MUTANT_PREFIX):]
    return parse_candidate(spec)[0]


def make_backend(spec: str) -> Backend:
    """A backend from a built-in name or a candidate spec."""
    if spec == "oracle":
        from .oracle import OracleBackend
        return OracleBackend()
    if spec == "fla":
        from .fla import FlaBackend
        return FlaBackend()
    if spec in ("pallas", "pallas-fused"):
        from .jax_backends import PallasBackend
        return PallasBackend(spec)
    if spec.startswith(MUTANT_PREFIX):
        from ..mutants import MutantBackend
        return MutantBackend(spec[len(MUTANT_PREFIX):])
    name, fw, fn = load_candidate_function(spec)
    if fw in ("jax", "pallas"):
        from .jax_backends import JaxCandidate
        return JaxCandidate(name, fn, spec, framework=fw)
    from .torch_candidate import TorchCandidate
    return TorchCandidate(name, fn, spec)


def check_specs(specs: list[str]) -> None:
    """Validate backend names and candidate specs (importing candidates) before any case runs."""
    seen = set()
    for s in specs:
        if s.startswith(MUTANT_PREFIX):
            from ..mutants import BY_NAME
            if s[len(MUTANT_PREFIX):] not in BY_NAME:
                raise SpecError(f"unknown mutant {s!r}: expected mutant:NAME with NAME one of {sorted(BY_NAME)}")
        elif s not in BUILTIN:
            if "=" not in s:
                raise SpecError(f"unknown backend {s!r}: expected one of {list(BUILTIN)} or a candidate NAME=FRAMEWORK:MODULE:FUNCTION")
            load_candidate_function(s)
        n = backend_name(s)
        if n in seen:
            raise SpecError(f"backend {n!r} given twice")
        seen.add(n)


def _check_specs_message(specs: list[str]) -> str | None:
    try:
        check_specs(specs)
    except SpecError as e:
        return str(e)
    return None


def check_specs_isolated(specs: list[str], timeout_s: float) -> None:
    """check_specs, with the candidates' modules imported in a child process (parity.proc), so
    that a module that hangs or ends the process at import is refused, not fatal. Built-in
    names are checked here without importing anything."""
    if not any("=" in s or s.startswith(MUTANT_PREFIX) for s in specs):
        return check_specs(specs)
    from ..proc import call_in_child
    status, value = call_in_child(_check_specs_message, (list(specs),), timeout_s)
    if status == "timeout":
        raise SpecError(f"importing the candidate modules of {specs} did not finish within {timeout_s:g} s (--timeout)")
    if status == "died":
        raise SpecError(f"importing the candidate modules of {specs} ended the process (exit code {value})")
    if value:
        raise SpecError(value)


__all__ = ["Backend", "BackendResult", "CompileSubject", "Execution", "Unsupported", "execute", "make_backend",
           "check_specs", "backend_name", "parse_candidate", "SpecError", "BUILTIN", "NAME_RE",
           "check_specs_isolated"]
