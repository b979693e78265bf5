"""Each candidate judged as if it ran alone: the process state a candidate changes, kept to it.

A worker runs every backend of a case in one process and is reused across cases, so whatever a
candidate's module sets at import, or its call sets, would stay for what runs after it (a library
that sets jax_default_matmul_precision to "highest" at import would have every later candidate's
dots computed as HIGHEST). `State` is what of a process a candidate can change and another's
numbers depend on:

    jax's configuration      jax.config.values (default matmul precision, x64, default device, ...)
    torch's                  default dtype, deterministic algorithms, float32 matmul precision,
                             the TF32 flags, threads
    numpy's                  floating-point error state
    the environment          os.environ, sys.path
    patched attributes       of jax, jax.numpy, jax.lax, jax.nn, numpy, torch, torch.nn.functional,
                             triton, triton.language: an attribute whose object was replaced (a
                             submodule imported meanwhile, or a function of the harness's own
                             code, is no change)

`imported(module, load)` imports a candidate's module, notes what its import changed and puts the
process back; `isolated(module)` runs one call of that candidate with its import-time changes in
force and puts the process back after it, noting what the call itself changed. Measured cost:
about 4 ms per call (a snapshot 0.25 ms, comparing two 1.8 ms, over 3436 attributes here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import types
from collections.abc import Callable, Iterator

WATCHED_MODULES = (
    "jax",
    "jax.numpy",
    "jax.lax",
    "jax.nn",
    "numpy",
    "torch",
    "torch.nn.functional",
    "triton",
    "triton.language",
)
# torch's settings: name -> (read, write)
_TORCH = {
    "default_dtype": (lambda t: t.get_default_dtype(), lambda t, v: t.set_default_dtype(v)),
    "deterministic_algorithms": (
        lambda t: t.are_deterministic_algorithms_enabled(),
        lambda t, v: t.use_deterministic_algorithms(v),
    ),
    "float32_matmul_precision": (
        lambda t: t.get_float32_matmul_precision(),
        lambda t, v: t.set_float32_matmul_precision(v),
    ),
    "backends.cuda.matmul.allow_tf32": (
        lambda t: t.backends.cuda.matmul.allow_tf32,
        lambda t, v: setattr(t.backends.cuda.matmul, "allow_tf32", v),
    ),
    "backends.cudnn.allow_tf32": (
        lambda t: t.backends.cudnn.allow_tf32,
        lambda t, v: setattr(t.backends.cudnn, "allow_tf32", v),
    ),
    "num_threads": (lambda t: t.get_num_threads(), lambda t, v: t.set_num_threads(v)),
}
_ABSENT = object()  # an environment variable that is not set


@dataclasses.dataclass(frozen=True)
class Change:
    """One setting a candidate changed: where it lives (jax, torch, numpy, environ, sys.path,
    attribute), its name, and its value before and after."""

    kind: str
    name: str
    before: object
    after: object

    def describe(self) -> str:
        """'jax_default_matmul_precision=highest', 'environ OMP_NUM_THREADS=1', 'jax.numpy.einsum patched'."""
        if self.kind == "attribute":
            return f"{self.name} patched"
        if self.kind == "sys.path":
            return "sys.path changed"
        value = "(unset)" if self.after is _ABSENT else self.after
        prefix = {"jax": "", "torch": "torch.", "numpy": "numpy errstate ", "environ": "environ "}[self.kind]
        return f"{prefix}{self.name}={value}"


@dataclasses.dataclass(frozen=True)
class State:
    """A snapshot of what a candidate can change (module docstring); None for a framework not imported."""

    jax: dict | None
    torch: dict | None
    numpy: dict
    environ: dict
    path: list
    attributes: dict


def _jax_config() -> dict | None:
    jax = sys.modules.get("jax")
    return dict(jax.config.values) if jax is not None and hasattr(jax, "config") else None


def _torch_settings() -> dict | None:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_default_dtype"):
        return None
    return {name: read(torch) for name, (read, _) in _TORCH.items()}


def capture() -> State:
    import numpy as np

    attributes = {name: dict(vars(sys.modules[name])) for name in WATCHED_MODULES if name in sys.modules}
    return State(_jax_config(), _torch_settings(), np.geterr(), dict(os.environ), list(sys.path), attributes)


_HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this package, parity/


def _harness_or_module(value) -> bool:
    """A submodule (imported meanwhile) or a function of the harness's own code (its TPU host's
    answers to jax's platform questions, installed once per process, however functools.wraps names
    them): no candidate's change."""
    if isinstance(value, types.ModuleType):
        return True
    code = getattr(value, "__code__", None)
    return code is not None and os.path.abspath(code.co_filename).startswith(_HARNESS + os.sep)


def changes(before: State, after: State) -> list[Change]:
    """What differs from `before` in `after`, in a fixed order."""
    out = []
    for kind, b, a in (("jax", before.jax, after.jax), ("torch", before.torch, after.torch)):
        for name in sorted(set(b or {}) & set(a or {})):
            if b[name] != a[name]:
                out.append(Change(kind, name, b[name], a[name]))
    out += [
        Change("numpy", k, before.numpy[k], after.numpy[k])
        for k in sorted(after.numpy)
        if before.numpy[k] != after.numpy[k]
    ]
    for k in sorted(set(before.environ) | set(after.environ)):
        b, a = before.environ.get(k, _ABSENT), after.environ.get(k, _ABSENT)
        if b != a:
            out.append(Change("environ", k, b, a))
    if before.path != after.path:
        out.append(Change("sys.path", "sys.path", before.path, after.path))
    for module in sorted(set(before.attributes) & set(after.attributes)):
        b, a = before.attributes[module], after.attributes[module]
        for name in sorted(set(b) & set(a)):
            if b[name] is not a[name] and not _harness_or_module(a[name]):
                out.append(Change("attribute", f"{module}.{name}", b[name], a[name]))
    return out


def put(settings: list[Change], side: str) -> list[str]:
    """Set each change to its `side` value ("before" or "after"); what could not be set, as lines."""
    failed = []
    for c in settings:
        value = getattr(c, side)
        try:
            if c.kind == "jax":
                sys.modules["jax"].config.update(c.name, value)
            elif c.kind == "torch":
                _TORCH[c.name][1](sys.modules["torch"], value)
            elif c.kind == "numpy":
                import numpy as np

                np.seterr(**{c.name: value})
            elif c.kind == "environ":
                if value is _ABSENT:
                    os.environ.pop(c.name, None)
                else:
                    os.environ[c.name] = value
            elif c.kind == "sys.path":
                sys.path[:] = value
            else:
                module, _, name = c.name.rpartition(".")
                setattr(sys.modules[module], name, value)
        except Exception as e:  # noqa: BLE001 - said in the record, never a crash of the run
            failed.append(f"{c.describe()}: could not be set to its {side} value: {type(e).__name__}: {e}")
    return failed


# the settings the candidate's own numbers follow, and how (the record's notes.global_state.numerics)
NUMERICS = {
    ("jax", "jax_default_matmul_precision"): lambda v: (
        f"its float32 dots at default precision computed as {str(v).upper()} (the TPU numerics model "
        "reads the precision a dot resolves to when it is traced)"
    ),
    ("jax", "jax_enable_x64"): lambda v: "64-bit types where its program asks for them" if v else "no 64-bit types",
    ("torch", "default_dtype"): lambda v: f"tensors it creates without a dtype are {v}",
    ("torch", "float32_matmul_precision"): lambda v: f"its float32 matmuls at torch's {v!r} precision",
    ("torch", "backends.cuda.matmul.allow_tf32"): lambda v: f"TF32 float32 matmuls on CUDA: {v}",
}


def numerics_used(at_import: list[Change], by_call: list[Change]) -> list[str]:
    """The changes the candidate's numbers follow, in words: 'jax_default_matmul_precision=highest,
    set at import: its float32 dots at default precision computed as HIGHEST (...)'."""
    out = []
    for when, made in (("set at import", at_import), ("set by its call", by_call)):
        for c in made:
            words = NUMERICS.get((c.kind, c.name))
            if words is not None:
                out.append(f"{c.describe()}, {when}: {words(c.after)}")
    return out


# module -> what its import changed (None: imported before the harness could see it)
IMPORTED: dict[str, list[Change] | None] = {}


def imported(module: str, load: Callable[[], types.ModuleType]) -> types.ModuleType:
    """load() (the import of a candidate's module), its changes to the process kept in IMPORTED
    and undone; a module imported already (by a test file, say) is noted as unseen."""
    if module in sys.modules:
        IMPORTED.setdefault(module, None)
        return load()
    before = capture()
    try:
        mod = load()
    finally:
        made = changes(before, capture())
        put(list(reversed(made)), "before")
    IMPORTED[module] = made
    return mod


@contextlib.contextmanager
def isolated(module: str) -> Iterator[dict]:
    """One call of the candidate whose module is `module`: its import-time changes in force, the
    process put back after it. Yields the record's notes entry, filled when the call ends:
    {"at_import": [...], "by_call": [...]} (each a Change.describe line), empty when neither."""
    at_import = IMPORTED.get(module) or []
    before = capture()
    put(at_import, "after")
    applied = capture()
    notes: dict = {}
    try:
        yield notes
    finally:
        after = capture()
        by_call = changes(applied, after)
        problems = put(list(reversed(changes(before, after))), "before")
        numerics = numerics_used(at_import, by_call)
        if at_import:
            notes["at_import"] = [c.describe() for c in at_import]
        if by_call:
            notes["by_call"] = [c.describe() for c in by_call]
        if numerics:
            notes["numerics"] = numerics
        if IMPORTED.get(module, []) is None:
            notes["at_import_unseen"] = (
                f"{module} was imported before this candidate was loaded (by another module or a test file): "
                "what its import changed is not known apart"
            )
        if problems:
            notes["not_restored"] = problems
