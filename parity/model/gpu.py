"""The GPU that FLA stands for on a host without one: an H100 (an H200 has the same SM).

FLA sizes its tiles and autotune config lists when its modules are imported, from the GPU's
shared memory (`fla.utils.check_shared_mem`, reading `fla.utils.hardware.get_all_max_shared_mem`).
On a CPU that probe finds no GPU, and FLA takes the tiles of the smallest GPU (BK 16, 32-wide
chunk tiles), which no H100 runs. `interpret_as_an_h100()` asks for Triton's interpreter
(TRITON_INTERPRET=1) and makes the probe answer an H100's SHARED_MEMORY as fla.utils.hardware is
loaded (an import hook: no installed file changes), so it must run before fla is imported; the
pytest plugin and `triton_interpreter.request()` call it.

`compile_as_an_h100()` is the same for FLA compiled for an H100 on a host without one (FLA's
kernels planned and compiled for sm_90 on a CPU: parity.execute.backends.gpu_target): no
interpreter, and FLA's other probes answer as the H100 too while fla.utils.hardware is loaded
(torch's device name and compute capability: IS_NVIDIA_HOPPER, which picks FLA's Hopper config
lists, its Hopper specialisations and its #640 guard). Standard library only (the pytest plugin
calls `interpret_as_an_h100` in every session without a GPU).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

# bytes of shared memory per block on an H100 or H200 (opt-in): fla.utils.hardware.Backend.HOPPER
SHARED_MEMORY = 232448
PROBE_MODULE = "fla.utils.hardware"
H100_NAME = "NVIDIA H100 80GB HBM3"  # torch.cuda.get_device_name() on an H100 SXM
H100_CAPABILITY = (9, 0)
_answers = {"as_device": False}  # compile_as_an_h100: torch's device probes answer while the module loads


def _answer(module) -> None:
    module.get_all_max_shared_mem = lambda: [SHARED_MEMORY]


def _load_as_the_device(load, module) -> None:
    """load(module) with torch.cuda's name, capability and count answering as an H100 where
    compile_as_an_h100 asked (put back after)."""
    if not _answers["as_device"]:
        return load(module)
    import torch

    answers = {
        "get_device_name": lambda *a, **k: H100_NAME,
        "get_device_capability": lambda *a, **k: H100_CAPABILITY,
        "device_count": lambda: 1,
    }
    saved = {name: getattr(torch.cuda, name) for name in answers}
    try:
        for name, answer in answers.items():
            setattr(torch.cuda, name, answer)
        return load(module)
    finally:
        for name, original in saved.items():
            setattr(torch.cuda, name, original)


class _ProbeLoader(importlib.abc.Loader):
    """Runs fla.utils.hardware as its own loader would, then sets its shared-memory probe."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        _load_as_the_device(self.loader.exec_module, module)
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
    _hook()


def compile_as_an_h100() -> None:
    """FLA's probes answer as an H100's while fla.utils.hardware loads (before fla is imported, with
    Triton's driver already answering as an H100: parity.execute.backends.gpu_target); no interpreter."""
    if PROBE_MODULE in sys.modules:
        raise RuntimeError("fla was imported before compile_as_an_h100(): its probes answered as this host")
    _answers["as_device"] = True
    _hook()


def _hook() -> None:
    if PROBE_MODULE in sys.modules:
        _answer(sys.modules[PROBE_MODULE])
    elif not any(isinstance(f, _ProbeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ProbeFinder())
