"""FLA's kernels compiled before the cases run: each (kernel, specialisation, config) once, on every core.

With a cold Triton cache a lane compiled each kernel as a case first launched it, one after another
in one process, while the other cores idled. `precompile(cases)` does the compiling first, in a pool
of processes (one per core, each importing torch, Triton and FLA once):

1. plan: each process calls FLA's functions on a share of the cases' inputs (forward and backward,
   CPU tensors) with Triton's jit_cache_hook answering every launch "compiled elsewhere": nothing is
   compiled and nothing runs, and each launch leaves its specialisation in Triton's own serialised
   form (signature, constants, attributes, options: what `JITFunction.preload` takes), at the config
   parity.execute.backends.fla_configs chose for its key (with --fla-autotune: every config the
   autotuner will time);
2. the launches of every case, each (module, kernel, Triton's kernel key) once: no two processes
   compile the same kernel;
3. compile: each is compiled by one process (`JITFunction.preload`) into the Triton cache the lanes
   read (`triton_cache_env`); one already there is loaded, not compiled (`Compiled.compiled`).

A lane then finds each kernel it launches in the cache and loads it; what it still compiles itself (a
launch the plan did not see) its record counts (notes.fla_compiled_here). On a host with a CUDA GPU
the pool's processes ask that GPU what it is; on a host without one they compile for an H100 (sm_90:
parity.execute.backends.gpu_target), which is how CI checks this and benchmarks/gpu_cost.py measures it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import multiprocessing as mp
import os
import resource
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from cases import Case, make_inputs
from cases.stages import stage_dtype, stage_input_names, stage_shapes
from parity.execute.backends import fla_launches, gpu_target
from parity.execute.backends.fla import FlaBackend, fla_call, fla_function
from parity.execute.proc import die_with_parent
from parity.measure.tol import NP_DTYPES
from parity.model.host import cuda_devices
from parity.model.spec import Unsupported

H100_VIEW = "an H100 (sm_90), compiled on this host's CPU"


def triton_cache_env(env) -> None:
    """Triton's cache and autotune results kept in the harness's cache: TRITON_CACHE_DIR (a user's own
    wins; default $PARITY_CACHE/triton) and TRITON_CACHE_AUTOTUNING=1. The pre-compile's processes and
    the lanes set the same, so a lane finds what the pool compiled."""
    root = env.get("PARITY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "parity")
    env.setdefault("TRITON_CACHE_DIR", str(Path(root) / "triton"))
    env.setdefault("TRITON_CACHE_AUTOTUNING", "1")


def cpu_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch to compile for: Triton's serialised specialisation of it."""

    module: str  # the kernel's module
    kernel: str  # its name there (the JITFunction, under FLA's autotune and heuristics wrappers)
    key: str  # Triton's kernel key (specialisation and options, the config among them)
    spec: str  # Triton's serialised specialisation (JITFunction.preload's argument)

    @property
    def ident(self) -> tuple[str, str, str]:
        return self.module, self.kernel, self.key


@dataclasses.dataclass(frozen=True)
class Plan:
    """The launches of one share of the cases, and the cases whose plan stopped early (case id -> why)."""

    launches: tuple[Launch, ...]
    stopped: dict
    cpu_s: float  # the planning process's CPU time for these cases


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What compiling one Launch did."""

    kernel: str
    triton_hash: str | None  # the compiled kernel's entry in Triton's cache
    compiled: bool  # False: it was in Triton's cache already, and was loaded
    wall_s: float
    cpu_s: float  # this process's and its children's (ptxas) CPU time
    shared_bytes: int | None  # the shared memory the kernel needs per block
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Report:
    """A pre-compile: what it planned, compiled and found compiled, where, and at what cost."""

    target: str  # "cuda:<device name>" or H100_VIEW
    triton: str  # the Triton version that compiled
    jobs: int
    cases: int
    launches: int  # launches the cases make (before each (kernel, specialisation, config) is taken once)
    stopped: dict  # case id -> why its plan stopped early (FLA refused it: the lane will too)
    planned: tuple[Launch, ...]  # each (kernel, specialisation, config) once
    results: tuple[Compiled, ...]  # what compiling each did, in the same order
    plan_cpu_s: float  # the plan's CPU time, over every process
    wall_s: float

    @property
    def compiled(self) -> list[Compiled]:
        return [r for r in self.results if r.compiled]

    @property
    def failed(self) -> list[Compiled]:
        return [r for r in self.results if r.error]

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "triton": self.triton,
            "jobs": self.jobs,
            "cases": self.cases,
            "launches": self.launches,
            "kernels": len(self.results),
            "compiled": len(self.compiled),
            "loaded": len(self.results) - len(self.compiled) - len(self.failed),
            "failed": {r.kernel: r.error for r in self.failed},
            "plan_stopped": self.stopped,
            "compile_cpu_s": round(sum(r.cpu_s for r in self.compiled), 2),
            "wall_s": round(self.wall_s, 2),
        }

    def line(self) -> str:
        return describe(self.to_dict())


def describe(d: dict) -> str:
    """One line of a pre-compile's Report.to_dict (or of why it did not run: {"error": ...})."""
    if "error" in d:
        return f"FLA pre-compile: did not run ({d['error']}); the lanes compiled what they launched"
    failed = f", {len(d['failed'])} failed ({', '.join(sorted(d['failed']))})" if d["failed"] else ""
    stopped = f"; {len(d['plan_stopped'])} cases planned in part (FLA refused them)" if d["plan_stopped"] else ""
    return (
        f"FLA pre-compile for {d['target']} (Triton {d['triton']}): {d['kernels']} kernels (kernel, "
        f"specialisation, config) of {d['cases']} cases, {d['compiled']} compiled ({d['compile_cpu_s']:.0f} "
        f"CPU-s), {d['loaded']} in Triton's cache{failed}{stopped}; {d['wall_s']:.1f} s on {d['jobs']} processes"
    )


# ------------------------------------------------------------------ the parent
def precompile(
    cases: list[Case], jobs: int | None = None, on_gpu: bool | None = None, on_pool=None, path_first: str | None = None
) -> Report:
    """Plan the cases' FLA launches and compile each (kernel, specialisation, config) once, in a pool
    of `jobs` processes (default: one per core). on_gpu: the pool asks this host's CUDA GPU (default:
    where one is visible), else it compiles for an H100 (gpu_target). on_pool(pool): called with the
    pool once it exists (`kill` ends it). path_first: a directory the pool imports before its
    environment's (another Triton: benchmarks/gpu_cost.py and the tests compile under the H200
    image's Triton 3.6.0)."""
    t0 = time.perf_counter()
    on_gpu = cuda_devices() > 0 if on_gpu is None else on_gpu
    jobs = max(1, jobs or cpu_count())
    ctx = mp.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(
        jobs, mp_context=ctx, initializer=_init, initargs=(on_gpu, path_first)
    )
    if on_pool is not None:
        on_pool(pool)
    try:
        shares = [[c.to_dict() for c in cases[i::jobs]] for i in range(min(jobs, len(cases)))]
        plans = list(pool.map(_plan_cases, shares))
        target, triton = pool.submit(_target).result()
        unique = {}
        for plan in plans:
            for launch in plan.launches:
                unique.setdefault(launch.ident, launch)
        planned = tuple(unique.values())
        results = tuple(pool.map(_compile, planned))
    except BaseException:
        kill(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    stopped = {k: v for plan in plans for k, v in plan.stopped.items()}
    launches, plan_cpu = sum(len(p.launches) for p in plans), sum(p.cpu_s for p in plans)
    wall = time.perf_counter() - t0
    return Report(target, triton, jobs, len(cases), launches, stopped, planned, results, plan_cpu, wall)


def kill(pool) -> None:
    """End a pre-compile's pool processes now (None: nothing to end)."""
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        p.kill()


# ------------------------------------------------------------------ the pool's processes
_process = {"device": None, "planned": None}


def _init(on_gpu: bool, path_first: str | None) -> None:
    """A pool process: Triton's cache as the lanes', FLA compiled (not interpreted) for this host's GPU
    or for an H100 (gpu_target), launches recorded by fla_launches, compiles counted."""
    die_with_parent()
    if path_first:
        sys.path.insert(0, path_first)
    os.environ.pop("TRITON_INTERPRET", None)
    triton_cache_env(os.environ)
    if not on_gpu:
        gpu_target.view_as_an_h100()
        _process["device"] = gpu_target.DEVICE_NAME
    else:
        import torch

        _process["device"] = torch.cuda.get_device_name()
    fla_launches.count_compiles()
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")  # Triton 3.9's notice, once per process
    import fla  # noqa: F401 - imported once per process, with the probes above

    fla_launches.install(interpreted=False, device_name=_process["device"])


def _target() -> tuple[str, str]:
    """(where the pool compiles for, the Triton version it compiles with)."""
    import triton

    where = H100_VIEW if _process["device"] == gpu_target.DEVICE_NAME and not _cuda() else f"cuda:{_process['device']}"
    return where, triton.__version__


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    """Triton's jit_cache_hook while planning: note the launch, and have Triton neither compile nor run it."""
    _process["planned"].append(Launch(fn.module, fn.name, str(key), compile["specialization_data"]))
    return True


def _plan_cases(case_dicts: list[dict]) -> Plan:
    """The launches FLA makes for these cases (forward and backward), none compiled, none run."""
    from triton import knobs

    launches, stopped, c0 = [], {}, _cpu_s()
    for d in case_dicts:
        case = Case.from_dict(d)
        _process["planned"] = []
        knobs.runtime.jit_cache_hook = _hook
        try:
            with fla_launches.planning(), np.errstate(all="ignore"):
                _call_fla(case)
        except Exception as e:  # noqa: BLE001 - FLA refused the case, or its plan broke: the lane will say
            stopped[case.id] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        finally:
            knobs.runtime.jit_cache_hook = None
        launches += _process["planned"]
    return Plan(tuple(launches), stopped, _cpu_s() - c0)


def _call_fla(case: Case) -> None:
    """FLA's function for the case, called as the lane calls it, on CPU tensors."""
    try:
        FlaBackend.kernel_call(case)
    except Unsupported:
        return
    module, name = fla_function(case)
    call, run = fla_call(case, getattr(importlib.import_module(module), name))
    run(call, case, _plan_inputs(case), "cpu")


def _plan_inputs(case: Case) -> dict[str, np.ndarray]:
    """An op case's inputs (cases.make_inputs); a stage case's, zeros of the shapes and dtypes FLA's op
    hands its stage function (what a launch's specialisation depends on: shapes, dtypes, alignment,
    the sequences' boundaries), without the float64 oracle that computes their values."""
    if case.stage is None:
        return make_inputs(case)
    shapes = stage_shapes(case)
    inputs = {n: np.zeros(shapes[n], NP_DTYPES.get(stage_dtype(case, n), np.float32)) for n in stage_input_names(case)}
    if case.cu_seqlens is not None:
        inputs["cu_seqlens"] = np.asarray(case.cu_seqlens, np.int64)
    return inputs


def _jit_function(module: str, kernel: str):
    """The JITFunction under the module's attribute `kernel` (FLA wraps it in autotune and heuristics)."""
    from triton.runtime.jit import JITFunction

    obj = importlib.import_module(module)
    for part in kernel.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction):
        obj = obj.fn
    return obj


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _compile(launch: Launch) -> Compiled:
    """Compile (or load from Triton's cache) one planned launch."""
    before, t0, c0 = fla_launches.compiles(), time.perf_counter(), _cpu_s()
    try:
        kernel = _jit_function(launch.module, launch.kernel).preload(launch.spec)
    except Exception as e:  # noqa: BLE001 - the lane meets it again and its record says why
        message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
        return Compiled(launch.kernel, None, fla_launches.compiles() > before, wall, cpu, None, message)
    return Compiled(
        launch.kernel,
        kernel.hash,
        fla_launches.compiles() > before,
        time.perf_counter() - t0,
        _cpu_s() - c0,
        getattr(kernel.metadata, "shared", None),
    )
