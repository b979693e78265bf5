"""What a worker process of `parity run` and `parity fuzz` runs (`worker_main`), the events it
sends its parent, and its retirement near the memory-map limit (RETIRE_AT_MAPS). The parent's side,
the pool of workers, is parity.execute.pool.

A worker is sent (case dict, backends to run) per case, Reload (a candidate's source changed:
`parity watch`) or None to exit. For each case it sends, in order: InputsMade, then per backend
BackendStarted and Done, then CaseEnded; or HarnessError when the harness itself failed on the
case (the worker exits after it). It sends nothing for a Reload.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import traceback
from pathlib import Path

from cases import Case
from parity.execute import compile_log
from parity.execute.case import LazyBackends, run_case
from parity.execute.proc import die_with_parent
from parity.model.host import keep_jax_on_the_cpu
from parity.model.spec import as_spec


# ------------------------------------------------------------------ the events a worker sends
@dataclasses.dataclass(frozen=True)
class InputsMade:
    """The case's inputs are built; input_hash: cases.input_hash of them."""

    case_id: str
    input_hash: str


@dataclasses.dataclass(frozen=True)
class BackendStarted:
    """A backend of the case starts; spec: the BackendSpec (or its text) as the worker was given it."""

    case_id: str
    spec: object


@dataclasses.dataclass(frozen=True)
class Done:
    """A backend's record is written; line: its summary line (parity.execute.case.summary_line)."""

    line: dict


@dataclasses.dataclass(frozen=True)
class CaseEnded:
    """Every backend of the case has its record. timing: run_case's, with the case's XLA
    compilations (parity.execute.compile_log); retire: the worker exits now (RETIRE_AT_MAPS)."""

    case_id: str
    timing: dict
    retire: bool


@dataclasses.dataclass(frozen=True)
class HarnessError:
    """The harness itself failed on the case (error: the message and traceback); the worker exits."""

    case_id: str
    error: str


# ------------------------------------------------------------------ what the parent sends
@dataclasses.dataclass(frozen=True)
class Reload:
    """The user's source changed: forget the modules named in `modules` and every module whose file
    is one of `files` (absolute paths), and the candidates' backends, so that the next case imports
    them afresh; jax, torch, triton, FLA and the harness stay imported."""

    modules: tuple[str, ...]
    files: tuple[str, ...]


def forget_user_modules(reload: Reload, backends: dict) -> list[str]:
    """Drop the modules `reload` names from sys.modules (and their files' bytecode caches: a save
    within the same second and of the same size would otherwise read the old one) and every
    candidate's backend from `backends`; returns the modules dropped."""
    files = {os.path.realpath(f) for f in reload.files}
    dropped = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if name in reload.modules or (path and os.path.realpath(path) in files):
            del sys.modules[name]
            dropped.append(name)
    for f in files:
        try:
            os.unlink(importlib.util.cache_from_source(f))
        except (OSError, ValueError, NotImplementedError):
            pass
    importlib.invalidate_caches()
    for spec in [s for s in backends if as_spec(s).side == "candidate"]:
        del backends[spec]
    return dropped


# ------------------------------------------------------------------ the worker's loop
def worker_main(
    conn, out_dir: str, run_id: str, tpu_targets: tuple[str, ...] = (), seeds: tuple[int, int] = (1, 1)
) -> None:
    """Run the cases sent over `conn` (a case dict and its backends; None: exit), sending the events
    above. Backends are built lazily, inside a case's timed window."""
    die_with_parent()
    keep_jax_on_the_cpu()  # a worker started by another parent than the command (the pytest plugin's fuzz)
    backends = LazyBackends()
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if isinstance(msg, Reload):
            forget_user_modules(msg, backends)
            continue
        case_dict, todo = msg
        case = Case.from_dict(case_dict)
        try:
            _, timing, _ = run_case(
                case,
                todo,
                backends,
                Path(out_dir),
                run_id,
                on_start=lambda spec: conn.send(BackendStarted(case.id, spec)),  # noqa: B023 - called in this iteration
                on_done=lambda line: conn.send(Done(line)),
                on_inputs=lambda h: conn.send(InputsMade(case.id, h)),  # noqa: B023 - called in this iteration
                tpu_targets=tpu_targets,
                seeds=seeds,
            )
        except Exception as e:  # noqa: BLE001 - the parent records it for the backends left
            error = f"harness error in the worker: {type(e).__name__}: {str(e)[:500]}\n"
            conn.send(HarnessError(case.id, error + traceback.format_exc(limit=-4)))
            return
        retire = memory_maps_used() > RETIRE_AT_MAPS
        conn.send(CaseEnded(case.id, {**timing, **compile_log.take()}, retire))
        if retire:
            return


# Every XLA compile of a case leaves executable memory mappings in the process (interpret-mode
# kernels: hundreds to a thousand per case), and Linux allows vm.max_map_count (65530) of them: a
# worker that has run some hundred cases dies in LLVM's "Cannot allocate memory" (SIGABRT; seen in
# parity fuzz: 60557 maps after 136 cases). A worker past this share of the limit finishes its case
# and exits; the parent starts a fresh one.
RETIRE_AT_MAPS = float(os.environ.get("PARITY_WORKER_RETIRE_AT_MAPS", "0.5"))  # tests: 0, after every case


def memory_maps_used() -> float:
    """This process's memory mappings as a share of vm.max_map_count (0 where /proc does not say)."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f) / max(1, limit)
    except (OSError, ValueError):
        return 0.0
