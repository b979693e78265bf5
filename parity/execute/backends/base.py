"""The backend interface.

A backend takes a `Case` and its inputs (numpy arrays from `cases.inputs.make_inputs`)
and returns every output and gradient the case asks for (`case.output_names()`:
o, ht, dq, dk, dv, dg or dg_gamma, dbeta or db and dw, dh0) as numpy arrays, plus where it really
ran. `execute` wraps a backend call so that any failure becomes a record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from typing import Any, Protocol

import numpy as np

from cases import Case, output_tensors
from parity.execute import isolation
from parity.execute.stack_room import call_with_stack_room
from parity.measure.tol import output_dtype
from parity.model.spec import KernelCall, Unsupported


@dataclasses.dataclass
class Execution:
    """What a backend returns for one case."""

    tensors: dict[str, np.ndarray]
    platform: str  # where it really ran: 'cpu:triton-interpreter', 'cuda:NVIDIA H100 ...'
    implementation: str  # e.g. 'fla.ops.simple_gla.chunk_simple_gla'
    versions: dict[str, str]
    kernel_time_s: float | None = None  # wall time of the kernel calls alone (fwd + bwd)
    numerics: str = ""  # how its arithmetic was computed: 'tpu-mxu-v1', 'float64', ...
    # free-form facts, e.g. {'chunk_size': 64} when the kernel used another chunk size than
    # the case, or {'unsupported_tensors': {'dg_gamma': 'why'}} for tensors it cannot produce
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class BackendResult:
    """One backend's outcome for one case: an Execution, or an error record."""

    backend: str
    side: str
    status: str  # one of STATUSES
    tensors: dict[str, np.ndarray]
    platform: str = ""
    implementation: str = ""
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    kernel_time_s: float | None = None
    wall_time_s: float | None = None
    numerics: str = ""
    error: str | None = None
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)


class Backend(Protocol):
    name: str  # 'oracle', 'fla', 'pallas', 'pallas-fused', or a candidate's name
    side: str  # one of SIDES

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        """Compute case.output_names(); raise Unsupported(reason) when there is no kernel."""
        ...

    def kernel_call(self, case: Case) -> KernelCall:
        """How run() calls its kernel for `case` (module, function, chunk_size passed or not):
        what `parity repro` writes into its script. Unsupported when there is no kernel."""
        ...


@dataclasses.dataclass
class CompileSubject:
    """What a jax backend compiles for TPU targets (parity.execute.tpu_compile): fn in FLA's calling
    convention; expect_mosaic when it claims to be a Pallas kernel (its TPU module must then contain
    a Mosaic kernel); forward_only for a candidate that declares itself forward-only (its forward
    program alone is compiled)."""

    fn: Any
    implementation: str
    expect_mosaic: bool = True
    forward_only: bool = False  # compile the forward of every case (calling.forward_case)


def check_tensors(
    case: Case,
    tensors: dict[str, Any],
    unsupported: dict[str, str] | None = None,
    exact_dtypes: bool = True,
) -> dict[str, np.ndarray]:
    """Every expected tensor present (or named in `unsupported` with a reason), with the
    shape of the tensor it belongs to and, from a kernel (`exact_dtypes`), in the case's output
    dtype (parity.measure.tol.output_dtype: o and the gradients of q, k, v and w in the case
    dtype, states and gate gradients float32, FLA's convention; a stage case's, cases.stages):
    an o left in float32 on a
    bfloat16 case would escape the output rounding the bound takes out of both sides."""
    unsupported = unsupported or {}
    expected = {name: t.shape for name, t in output_tensors(case).items()}
    out = {}
    for name in case.output_names():
        if name not in tensors or tensors[name] is None:
            if name in unsupported:
                continue
            raise ValueError(f"backend returned no {name!r} (expected {case.output_names()})")
        arr = np.asarray(tensors[name])
        if arr.shape != tuple(expected[name]):
            raise ValueError(f"{name!r} has shape {arr.shape}, expected {tuple(expected[name])}")
        if arr.dtype.kind not in "fV" and arr.dtype.name != "bfloat16":
            raise ValueError(f"{name!r} has dtype {arr.dtype}, expected a floating dtype")
        want = output_dtype(case, name)
        if exact_dtypes and arr.dtype.name != want:
            raise ValueError(f"{name!r} has dtype {arr.dtype.name}, expected {want} (the case's output dtype)")
        out[name] = arr
    return out


def execute(backend: Backend, case: Case, inputs: dict[str, np.ndarray]) -> BackendResult:
    """Run one backend on one case; exceptions, unsupported cases and bad outputs become records.
    The backend gets its own copy of the inputs (a kernel that writes into them, or donates them,
    changes nothing for the next); a user's candidate (one with a `module`) runs with its module's
    import-time changes to the process in force and the process put back after it
    (parity.execute.isolation), what it changed noted (notes.global_state)."""
    t0 = time.perf_counter()
    base = dict(backend=backend.name, side=backend.side, tensors={})
    module = getattr(backend, "module", None)
    try:
        own = {name: np.array(a, copy=True) for name, a in inputs.items()}
        with isolation.isolated(module) if module else contextlib.nullcontext({}) as state:
            ex = call_with_stack_room(backend.run, case, own)  # as fast at any caller's depth
        if state:
            ex = dataclasses.replace(ex, notes={**ex.notes, "global_state": state})
        absent = {**ex.notes.get("unsupported_tensors", {}), **ex.notes.get("not_judged", {})}
        tensors = check_tensors(case, ex.tensors, absent, exact_dtypes=backend.side != "oracle")
    except Unsupported as e:
        return BackendResult(**base, status="unsupported", error=str(e), wall_time_s=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - a failing case must never stop the run
        tb = traceback.format_exc(limit=-6)
        known = getattr(e, "record_fields", {})  # where it failed, the versions and notes, when the error says
        return BackendResult(
            **base,
            status="error",
            error=f"{type(e).__name__}: {e}\n{tb}",
            wall_time_s=time.perf_counter() - t0,
            **{k: known[k] for k in ("platform", "versions", "notes") if k in known},
        )
    return BackendResult(
        **{**base, "tensors": tensors},
        status="ok",
        platform=ex.platform,
        implementation=ex.implementation,
        versions=ex.versions,
        kernel_time_s=ex.kernel_time_s,
        numerics=ex.numerics,
        notes=ex.notes,
        wall_time_s=time.perf_counter() - t0,
    )
