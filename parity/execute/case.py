"""One case through its backends: build them, run the oracle then the others, compare each
against the oracle, write a result record per backend (and a compile record per jax candidate
with TPU targets), and the one-line summaries `parity run` collects.

Used by the worker processes of `parity run` (parity.execute.worker), `parity fuzz` and the pytest
plugin.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from pathlib import Path

import numpy as np

from cases import Case, input_hash, make_inputs
from parity.execute.backends import BackendResult, as_spec, execute, make_backend
from parity.execute.backends.oracle import cached_oracle
from parity.execute.tpu_compile import compile_for_targets
from parity.measure.compare import compare_tensor
from parity.records import ResultRecord, base_record, result_path, worst_verdict, write_record
from references import error_scales


# ------------------------------------------------------------------ records
def _tensor_records(case, result, oracle, scales) -> dict:
    recs = {}
    for name in case.output_names():
        if name in result.tensors:
            recs[name] = compare_tensor(case, name, result.tensors[name], oracle[name], scales.get(name))
        else:
            reason = result.notes.get("unsupported_tensors", {}).get(name, "not returned")
            recs[name] = {"verdict": "unsupported", "reason": reason}
    return recs


def _oracle_tensor_stats(tensors) -> dict:
    return {
        n: {
            "shape": list(a.shape),
            "rms": float(np.sqrt(np.mean(np.square(a)))) if a.size else 0.0,
            "max_abs": float(np.abs(a).max(initial=0.0)),
            "nonfinite": int(np.sum(~np.isfinite(a))),
            "verdict": "pass",
        }
        for n, a in tensors.items()
    }


def _record(case, spec, result, oracle, input_hash, run_id, scales=None) -> ResultRecord:
    """The result record of `result` (spec: the BackendSpec, or its text, it ran as); `oracle`
    the oracle's tensors, `scales` its error scales (references.error_scales)."""
    rec = base_record(case, spec, result.backend, result.side, input_hash, run_id)
    rec.update(
        status=result.status,
        platform=result.platform,
        implementation=result.implementation,
        versions=result.versions,
        numerics=result.numerics,
        kernel_time_s=result.kernel_time_s,
        wall_time_s=result.wall_time_s,
        error=result.error,
        notes=result.notes,
    )
    if result.status != "ok":
        rec["tensors"], rec["verdict"] = {}, result.status
    elif result.side == "oracle":
        rec["tensors"] = _oracle_tensor_stats(result.tensors)
        rec["verdict"] = "pass"
    else:
        rec["tensors"] = _tensor_records(case, result, oracle, scales or {})
        tv = [t["verdict"] for t in rec["tensors"].values()]
        rec["verdict"] = (
            worst_verdict([v for v in tv if v != "unsupported"])
            if any(v != "unsupported" for v in tv)
            else "unsupported"
        )
    return rec


def _summary_line(rec: dict) -> dict:
    worst_name, worst_eps = None, None
    for name, t in rec.get("tensors", {}).items():
        eps = t.get("rel_rms")
        if t.get("nan") or t.get("inf"):
            worst_name, worst_eps = name, None
            break
        if eps is not None and (
            worst_eps is None
            or eps / max(t["tol"], 1e-300) > worst_eps / max(rec["tensors"][worst_name]["tol"], 1e-300)
        ):
            worst_name, worst_eps = name, eps
    return {
        "case_id": rec["case_id"],
        "backend": rec["backend"],
        "side": rec["side"],
        "status": rec["status"],
        "verdict": rec["verdict"],
        "platform": rec.get("platform", ""),
        "worst_tensor": worst_name,
        "worst_rel_rms": worst_eps,
        "wall_time_s": rec.get("wall_time_s"),
        "kernel_time_s": rec.get("kernel_time_s"),
        "error": (rec.get("error") or "").splitlines()[0][:300] if rec.get("error") else None,
        "input_hash": rec.get("input_hash"),
    }


# ------------------------------------------------------------------ backends and the case
class LazyBackends(dict):
    """spec (BackendSpec or its text) -> backend, built on first use (so inside the timed window
    of a case), or the exception that creating it raised (recorded per case)."""

    def __missing__(self, spec):
        try:
            b = make_backend(spec)
        except Exception as e:  # noqa: BLE001 - recorded per case
            b = e
        self[spec] = b
        return b


def build_backends(specs: list) -> dict:
    """spec -> backend, or the exception that creating it raised (recorded per case)."""
    out = LazyBackends()
    for spec in specs:
        out[spec]  # built now
    return out


def run_case(
    case: Case,
    todo: list,
    backends: dict,
    out_dir: Path,
    run_id: str,
    on_start=lambda spec: None,
    on_done=lambda line: None,
    on_inputs=lambda h: None,
    tpu_targets: tuple[str, ...] = (),
) -> tuple[list[dict], dict, list[dict]]:
    """Run one case through the backends in `todo` (BackendSpecs or their texts, oracle first;
    `backends` maps each to its backend), write a record per backend, compile each jax candidate
    for `tpu_targets`, and return (records, timing, compile records). Used by worker processes
    and the pytest plugin."""
    t_case = time.perf_counter()
    inputs = make_inputs(case)
    h = input_hash(inputs)
    on_inputs(h)
    oracle, scales = None, {}
    backend_wall = compile_wall = 0.0
    records, compiles = [], []
    has_oracle = any(as_spec(item).side == "oracle" for item in todo)
    for item in todo:
        spec = as_spec(item)
        name = spec.name
        on_start(item)
        b = backends[item]
        if isinstance(b, Exception):
            result = BackendResult(
                backend=name,
                side=spec.side,
                status="error",
                tensors={},
                error=f"backend could not be created: {type(b).__name__}: {b}",
            )
        elif spec.side != "oracle" and oracle is None and has_oracle:
            result = BackendResult(
                backend=name,
                side=b.side,
                status="error",
                tensors={},
                error="the oracle failed for this case, nothing to compare against",
            )
        else:
            if spec.side != "oracle" and oracle is None:
                full = cached_oracle(case, inputs)[0]
                oracle, scales = {n: full[n] for n in case.output_names()}, error_scales(full)
            result = execute(b, case, inputs)
            backend_wall += result.wall_time_s or 0.0
            if spec.side == "oracle" and result.status == "ok":
                oracle, scales = result.tensors, result.notes["error_scales"]
        try:
            rec = _record(case, spec, result, oracle, h, run_id, scales)
        except Exception:  # noqa: BLE001 - a comparison bug must not lose the run
            result = dataclasses.replace(
                result, status="error", tensors={}, error="comparison failed:\n" + traceback.format_exc(limit=-4)
            )
            rec = _record(case, spec, result, oracle, h, run_id, scales)
        rec = write_record(result_path(Path(out_dir), name, case.id), rec)
        records.append(rec)
        if result.status != "unsupported" and not isinstance(b, Exception):
            t_compile = time.perf_counter()
            try:
                crec = compile_for_targets(case, spec, b, tpu_targets, out_dir, run_id)
            except Exception:  # noqa: BLE001 - a compile-check bug must not lose the run
                crec = None
                rec["notes"]["compile_check_error"] = traceback.format_exc(limit=-4)
                rec = write_record(result_path(Path(out_dir), name, case.id), rec)
            if crec is not None:
                compiles.append(crec)
            compile_wall += time.perf_counter() - t_compile
        on_done(_summary_line(rec))
    return (
        records,
        {"total_s": time.perf_counter() - t_case, "backends_s": backend_wall, "compile_s": compile_wall},
        compiles,
    )
