"""The GPU that FLA in the Triton interpreter stands for: an H100 (an H200 has the same SM).

FLA sizes its tiles and autotune config lists when its modules are imported, from the GPU's
shared memory (`fla.utils.check_shared_mem`, reading `fla.utils.hardware.get_all_max_shared_mem`).
On a CPU that probe finds no GPU, and FLA takes the tiles of the smallest GPU (BK 16, 32-wide
chunk tiles), which no H100 runs. `interpret_as_an_h100()` asks for Triton's interpreter
(TRITON_INTERPRET=1) and makes the probe answer an H100's SHARED_MEMORY as fla.utils.hardware is
loaded (an import hook: no installed file changes), so it must run before fla is imported; the
pytest plugin and `triton_interpreter.request()` call it. Standard library only (the pytest
plugin calls it in every session without a GPU).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

# bytes of shared memory per block on an H100 or H200 (opt-in): fla.utils.hardware.Backend.HOPPER
SHARED_MEMORY = 232448
PROBE_MODULE = "fla.utils.hardware"


def _answer(module) -> None:
    module.get_all_max_shared_mem = lambda: [SHARED_MEMORY]


class _ProbeLoader(importlib.abc.Loader):
    """Runs fla.utils.hardware as its own loader would, then sets its shared-memory probe."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _answer(module)


class _ProbeFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != PROBE_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _ProbeLoader(spec.loader)
        return spec


def interpret_as_an_h100() -> None:
    """Ask for Triton's interpreter, and set FLA's shared-memory probe as fla.utils.hardware is
    loaded, or now if it is loaded already (then the fla modules imported before keep the tiles
    they sized)."""
    os.environ["TRITON_INTERPRET"] = "1"
    if PROBE_MODULE in sys.modules:
        _answer(sys.modules[PROBE_MODULE])
    elif not any(isinstance(f, _ProbeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ProbeFinder())
