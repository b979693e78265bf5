"""A mutant's kernels: its own copy of the kernels_jax package with its patches applied.

kernels_jax holds no trace of any mutant; a mutant's bug is planted in a copy of the package
(`patched_module(mutant, "kernels_jax.simple_gla")`), a top-level package of its own named
kernels_jax_mutant_<name>, built once per process:
  - its fresh modules are the patched ones, every module that imports a fresh one, and the
    packages above them: each compiled from its (patched) source, with its absolute
    `kernels_jax` imports renamed to the copy's, and with kernels_jax's own file names (so
    tracebacks and jax's source locations name the real files, and a patch that changes
    nothing a case traces lowers to the real kernel's TPU module byte for byte);
  - every other module of the copy is the real module (one kernels_jax.common.platform, and so
    one compile_for_tpu() flag, for the real kernels and the mutants).
The copy's functions are other objects than the real kernel's, so jax shares no trace between
them; the real modules are never modified. A patch whose text does not occur exactly once in
its module refuses the mutant (PatchError), so a kernel edit that removes a planted spot fails
loudly (tests/test_mutants.py applies every mutant's patches).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.abc
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from cases import Case
from parity.model.kernels import pallas_kernel, pallas_location
from parity.mutants.catalogue import Mutant, Patch

PACKAGE = "kernels_jax"


class PatchError(ValueError):
    """A mutant's patch does not apply to kernels_jax as it is."""


def package_name(mutant: Mutant) -> str:
    """The top-level name of the mutant's copy of kernels_jax, e.g. kernels_jax_mutant_bf16_state."""
    return f"{PACKAGE}_mutant_" + re.sub(r"\W", "_", mutant.name)


def patched_module(mutant: Mutant, module: str) -> ModuleType:
    """kernels_jax module `module` (e.g. "kernels_jax.simple_gla") as the mutant's copy holds it
    (the real module for a mutant without patches)."""
    if not mutant.patches:
        return importlib.import_module(module)
    root = _install(package_name(mutant), _patched_sources(mutant))
    return importlib.import_module(root + module.removeprefix(PACKAGE))


def mutant_kernel(mutant: Mutant, case: Case) -> Callable:
    """The function the mutant's implementation runs for `case` (its wrap not applied), from the
    mutant's copy of kernels_jax; Unsupported where the implementation has no kernel for it."""
    fn = pallas_kernel(mutant.impl, case)
    if not mutant.patches:
        return fn
    module, function = pallas_location(mutant.impl, case)
    return getattr(patched_module(mutant, module), function)


def patched_sources(mutant: Mutant) -> dict[str, str]:
    """module -> its source with the mutant's patches applied, for the modules they edit;
    PatchError naming the mutant and module where a patch's text is not there exactly once."""
    return dict(_patched_sources(mutant))


@functools.cache
def _patched_sources(mutant: Mutant) -> tuple[tuple[str, str], ...]:
    files = _module_files()
    sources: dict[str, str] = {}
    for patch in mutant.patches:
        if patch.module not in files:
            raise PatchError(f"mutant {mutant.name}: kernels_jax has no module {patch.module}")
        source = sources.get(patch.module) or files[patch.module].read_text()
        sources[patch.module] = _apply(mutant.name, patch, source)
    return tuple(sorted(sources.items()))


def _apply(name: str, patch: Patch, source: str) -> str:
    found = source.count(patch.old)
    if found != 1:
        raise PatchError(
            f"mutant {name}: the text it patches occurs {found} times in {patch.module}, not once "
            f"(the kernel changed: update the mutant's patch in parity/mutants): {patch.old!r}"
        )
    return source.replace(patch.old, patch.new)


@functools.cache
def _module_files() -> dict[str, Path]:
    """Every kernels_jax module (packages by their name) -> its source file."""
    base = Path(importlib.util.find_spec(PACKAGE).origin).parent
    files = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base).with_suffix("").parts
        files[".".join((PACKAGE, *parts[: -1 if parts[-1] == "__init__" else None]))] = path
    return files


def _imports(module: str, source: str, path: Path, known) -> set[str]:
    """The kernels_jax modules that `source` (of `module`, at `path`) imports, anywhere in it."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.update([base, *(f"{base}.{a.name}" for a in node.names)])
    return found & known


def _packages_above(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@functools.cache
def _install(root: str, patched: tuple[tuple[str, str], ...]) -> str:
    """Make the copy named `root` importable (once per process): the real modules it shares in
    sys.modules under its names, a finder for its fresh modules. Returns root."""
    files = _module_files()
    sources = {m: files[m].read_text() for m in files} | dict(patched)
    imports = {m: _imports(m, sources[m], files[m], set(files)) for m in files}
    fresh = {m for m, _ in patched}
    while True:
        more = {m for m in files if imports[m] & fresh} | {p for m in fresh for p in _packages_above(m)}
        if more <= fresh:
            break
        fresh |= more
    shared = {d for m in fresh for d in imports[m] - fresh}
    shared |= {p for d in shared for p in _packages_above(d) if p not in fresh}
    for module in sorted(shared):
        sys.modules[root + module.removeprefix(PACKAGE)] = importlib.import_module(module)
    renamed = {
        m: re.sub(rf"^(\s*(?:from|import)\s+){PACKAGE}\b", rf"\g<1>{root}", sources[m], flags=re.M) for m in fresh
    }
    sys.meta_path.insert(0, _CopyFinder(root, renamed, files))
    return root


class _CopyFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and runs the fresh modules of one mutant's copy of kernels_jax."""

    def __init__(self, root: str, sources: dict[str, str], files: dict[str, Path]):
        self.root, self.sources, self.files = root, sources, files

    def _real_name(self, name: str) -> str | None:
        if name == self.root or name.startswith(self.root + "."):
            return PACKAGE + name.removeprefix(self.root)
        return None

    def find_spec(self, fullname, path=None, target=None):
        real = self._real_name(fullname)
        if real not in self.sources:
            return None
        path = self.files[real]
        return importlib.util.spec_from_loader(fullname, self, origin=str(path), is_package=path.name == "__init__.py")

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        real = self._real_name(module.__name__)
        module.__file__ = str(self.files[real])
        code = compile(self.sources[real], module.__file__, "exec", dont_inherit=True)
        exec(code, module.__dict__)
