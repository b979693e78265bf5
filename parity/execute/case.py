"""One case through its backends: build them, run the oracle then the others, compare each
against the oracle, write a result record per backend (and a compile record per jax candidate
with TPU targets), and the one-line summaries `parity run` collects.

Used by the worker processes of `parity run` (parity.execute.worker), `parity fuzz` and the pytest
plugin.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from pathlib import Path

import numpy as np

from cases import Case, input_hash, seed_at
from parity.execute import tpu_identity
from parity.execute.backends import BackendResult, as_spec, execute, make_backend
from parity.execute.backends.oracle import cached_oracle
from parity.execute.tpu_compile import compile_for_targets
from parity.measure import tpu_numerics
from parity.measure.compare import compare_tensor, compute_judgement
from parity.model.inputs import case_inputs
from parity.model.verdict import UNJUDGED, Verdict, worst_verdict
from parity.records import ResultRecord, base_record, repro_command, result_path, tpu_kernel_problem, write_record
from references import error_scales


# ------------------------------------------------------------------ records
def _tensor_records(case, result, oracle, scales, input_hash=None) -> dict:
    """Tensor name -> compare_tensor's record, its blocks moved into "seeds": one entry, the
    figures of this case's seed (run_case appends those of further seeds)."""
    recs = {}
    for name in case.output_names():
        if name in result.tensors:
            t = compare_tensor(case, name, result.tensors[name], oracle[name], scales.get(name))
            t["seeds"] = [_seed_entry(case.seed, input_hash, t)]
            recs[name] = t
        elif name in result.notes.get("not_judged", {}):
            recs[name] = {"verdict": Verdict.NOT_JUDGED, "reason": result.notes["not_judged"][name]}
        else:
            reason = result.notes.get("unsupported_tensors", {}).get(name, "not returned")
            recs[name] = {"verdict": Verdict.UNSUPPORTED, "reason": reason}
    return recs


def _seed_entry(seed: int, input_hash, t: dict) -> dict:
    """What the bound uses of one seed of a tensor (compare_tensor's record t; its blocks taken out)."""
    blocks = t.pop("blocks")
    keep = ("rel_rms", "floor_rel", "max_abs", "nan", "inf", "verdict")
    return {"seed": seed, "input_hash": input_hash, **{k: t[k] for k in keep}, **blocks}


def _oracle_tensor_stats(tensors) -> dict:
    return {
        n: {
            "shape": list(a.shape),
            "rms": float(np.sqrt(np.mean(np.square(a)))) if a.size else 0.0,
            "max_abs": float(np.abs(a).max(initial=0.0)),
            "nonfinite": int(np.sum(~np.isfinite(a))),
            "verdict": Verdict.PASS,
        }
        for n, a in tensors.items()
    }


def _record(case, spec, result, oracle, input_hash, run_id, scales=None) -> ResultRecord:
    """The result record of `result` (spec: the BackendSpec, or its text, it ran as); `oracle`
    the oracle's tensors, `scales` its error scales (references.error_scales)."""
    rec = base_record(case, spec, result.backend, result.side, input_hash, run_id)
    rec["seeds"] = [{"seed": case.seed, "input_hash": input_hash}]
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
        rec["verdict"] = Verdict.PASS
    else:
        rec["tensors"] = _tensor_records(case, result, oracle, scales or {}, input_hash)
        rec["verdict"] = _verdict(rec, Verdict.UNSUPPORTED)
        rec["error"] = tpu_kernel_problem(rec) or rec["error"]
    return rec


def _verdict(rec: dict, none_judged: str) -> str:
    """A candidate or reference record's verdict: the worst of its judged tensors', and error for a
    Pallas candidate that did not run as a TPU kernel (tpu_kernel_problem); `none_judged` when
    neither applies."""
    verdicts = [t["verdict"] for t in rec["tensors"].values() if t["verdict"] not in UNJUDGED]
    verdicts += [Verdict.ERROR] if tpu_kernel_problem(rec) else []
    return worst_verdict(verdicts) if verdicts else none_judged


def summary_line(rec: dict) -> dict:
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
        "reused": bool((rec.get("notes") or {}).get("reused")),  # a stored result (FLA's), not run now
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


def compile_then_execute(case, spec, backend, inputs, tpu_targets, out_dir, run_id):
    """(result, compile record or None, compile-check traceback or None) of one backend on one
    case: a jax candidate is compiled for `tpu_targets` first (compile_for_targets) and run
    with the TPU numerics model's decision from its compile for the target TPU interpret mode
    emulates (tpu_numerics.deciding: its dots the compiler left to the vector unit computed in
    float32); without that compile, every dot is an MXU dot. A candidate that turns out not to
    support the case keeps no compile record (as if never compiled)."""
    crec, error = None, None
    if spec.side == "candidate" and tpu_targets:
        try:
            crec = compile_for_targets(case, spec, backend, tpu_targets, out_dir, run_id)
        except Exception:  # noqa: BLE001 - a compile-check bug must not lose the run
            error = traceback.format_exc(limit=-4)
    with _numerics_decided(crec):
        result = execute(backend, case, inputs)
    if crec is not None and result.status == "unsupported":
        result_path(Path(out_dir), spec.name, case.id, kind="compile").unlink(missing_ok=True)
        crec = None
    return result, crec, error


def _numerics_decided(crec):
    """tpu_numerics.deciding from the compile record's result for the emulated target; a no-op
    without one."""
    target = tpu_identity.interpret_target()[0]
    r = (crec or {}).get("targets", {}).get(target)
    if r is None:
        return contextlib.nullcontext()
    where = f"compile for {target} ({r.get('device_kind', '?')}, libtpu {crec.get('libtpu')})"
    numerics = r.get("numerics") or {}
    if not r.get("ok") or "vector_unit" not in numerics:
        why = numerics.get("error") or r.get("error_line") or "not compiled"
        return tpu_numerics.deciding({}, f"none: the {where} gave no decision ({why[:200]}); every dot on the MXU")
    return tpu_numerics.deciding(numerics["vector_unit"], where)


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
    seeds: tuple[int, int] = (1, 1),
) -> tuple[list[dict], dict, list[dict]]:
    """Run one case through the backends in `todo` (BackendSpecs or their texts, oracle first;
    `backends` maps each to its backend), write a record per backend, compile each jax candidate
    for `tpu_targets`, and return (records, timing, compile records). Used by worker processes
    and the pytest plugin. seeds = (min, max): after the case's own seed, further input seeds
    (cases.seed_at) run through every backend but the oracle while `wants_seed` says so, their
    figures appended to each tensor's "seeds" (parity.measure.compute_error)."""
    t_case = time.perf_counter()
    inputs = case_inputs(case)
    h = input_hash(inputs)
    on_inputs(h)
    oracle = _OracleOutputs()
    backend_wall = compile_wall = 0.0
    records, compiles = [], []
    has_oracle = any(as_spec(item).side == "oracle" for item in todo)
    for item in todo:
        spec = as_spec(item)
        on_start(item)
        result, crec, compile_error, compile_s = _run_backend(
            case, spec, backends[item], inputs, oracle, has_oracle, tpu_targets, out_dir, run_id
        )
        backend_wall += result.wall_time_s or 0.0
        compile_wall += compile_s
        if crec is not None:
            compiles.append(crec)
        rec = _write_result(case, spec, result, oracle, h, run_id, compile_error, seeds, out_dir)
        records.append(rec)
        on_done(summary_line(rec))
    t_seeds = time.perf_counter()
    for k in range(1, seeds[1]):
        if not wants_seed(records, k, *seeds):
            break
        backend_wall += _run_seed(case.replace(seed=seed_at(case.seed, k)), todo, backends, records, out_dir, compiles)
    timing = {"total_s": time.perf_counter() - t_case, "backends_s": backend_wall, "compile_s": compile_wall}
    timing["seeds_s"] = time.perf_counter() - t_seeds
    return records, timing, compiles


@dataclasses.dataclass
class _OracleOutputs:
    """The oracle's output tensors for a case (None until known) and their error scales
    (references.error_scales)."""

    tensors: dict | None = None
    scales: dict = dataclasses.field(default_factory=dict)


def _run_backend(case, spec, backend, inputs, oracle: _OracleOutputs, has_oracle: bool, tpu_targets, out_dir, run_id):
    """(result, compile record or None, compile-check traceback or None, seconds compiling) of one
    backend (or the exception creating it raised) on the case's own seed. The oracle's result sets
    `oracle`; without the oracle among the case's backends it comes from the cache."""
    not_run = _not_run(spec, backend, oracle_failed=has_oracle and oracle.tensors is None)
    if not_run is not None:
        return not_run, None, None, 0.0
    if spec.side != "oracle" and oracle.tensors is None:
        full = cached_oracle(case, inputs)[0]
        oracle.tensors, oracle.scales = {n: full[n] for n in case.output_names()}, error_scales(full)
    # a jax candidate is compiled first: its compile decides which of its dots the TPU numerics model
    # computes on the vector unit while it runs (compile_then_execute)
    t_compile = time.perf_counter()
    result, crec, compile_error = compile_then_execute(case, spec, backend, inputs, tpu_targets, out_dir, run_id)
    compile_s = time.perf_counter() - t_compile - (result.wall_time_s or 0.0)
    if spec.side == "oracle" and result.status == "ok":
        oracle.tensors, oracle.scales = result.tensors, result.notes["error_scales"]
    return result, crec, compile_error, compile_s


def _not_run(spec, backend, oracle_failed: bool) -> BackendResult | None:
    """The error result of a backend that cannot run on the case (creating it raised, or it is a
    candidate or reference and the oracle failed), or None."""
    if isinstance(backend, Exception):
        error = f"backend could not be created: {type(backend).__name__}: {backend}"
        return BackendResult(backend=spec.name, side=spec.side, status="error", tensors={}, error=error)
    if spec.side != "oracle" and oracle_failed:
        error = "the oracle failed for this case, nothing to compare against"
        return BackendResult(backend=spec.name, side=backend.side, status="error", tensors={}, error=error)
    return None


def _write_result(case, spec, result, oracle: _OracleOutputs, h, run_id, compile_error, seeds, out_dir) -> dict:
    """Write the result record of `result` (an error record when comparing it failed) and return it."""
    try:
        rec = _record(case, spec, result, oracle.tensors, h, run_id, oracle.scales)
    except Exception:  # noqa: BLE001 - a comparison bug must not lose the run
        result = dataclasses.replace(
            result, status="error", tensors={}, error="comparison failed:\n" + traceback.format_exc(limit=-4)
        )
        rec = _record(case, spec, result, oracle.tensors, h, run_id, oracle.scales)
    if compile_error:
        rec["notes"]["compile_check_error"] = compile_error
    rec["seed_policy"] = {"min": seeds[0], "max": seeds[1]}
    rec["repro"] = repro_command(case.id, spec, seeds)  # with the seed policy the verdict was judged by
    return write_record(result_path(Path(out_dir), spec.name, case.id), rec)


def _pairs(records: list[dict]) -> list[tuple[dict, dict]]:
    """(candidate, reference) records of a case that both ran."""
    refs = [r for r in records if r["side"] == "reference" and r["status"] == "ok"]
    return [(c, r) for c in records if c["side"] == "candidate" and c["status"] == "ok" for r in refs]


def wants_seed(records: list[dict], k: int, seeds_min: int, seeds_max: int) -> bool:
    """Whether seed k (0-based) should run: the bound of some tensor of a candidate still passing
    asks for more (compute_error.verdict_after at factor 1: below seeds_min only far from the bound
    decides; undecided goes on up to seeds_max); with no reference and candidate side by side in
    this run (each side on its own machine), seeds_min."""
    pairs = _pairs(records)
    ran = [r for r in records if r["side"] != "oracle" and r["status"] == "ok"]
    if not pairs:
        return bool(ran) and k < seeds_min
    for cand, ref in pairs:
        if cand["verdict"] not in (Verdict.PASS, Verdict.UNSUPPORTED):
            continue  # already failed: more seeds cannot change that
        for name, ct in cand["tensors"].items():
            rt = ref["tensors"].get(name)
            if ct["verdict"] != Verdict.PASS or not rt or rt.get("rel_rms") is None:
                continue
            j = compute_judgement(ct, rt, 1.0, seeds_min, seeds_max)
            if j and j["state"] == "more":
                return True
    return False


def _run_seed(
    case: Case, todo: list, backends: dict, records: list[dict], out_dir: Path, compiles: list[dict] = ()
) -> float:
    """Run `case` (a further seed of the case of `records`) through every backend but the oracle whose
    record is ok (a jax candidate under its compile's numerics decision, from `compiles`, as on the
    first seed), append each tensor's figures to its "seeds" and rewrite the record; a backend that
    fails on this seed takes that status. Returns the seconds spent in backends."""
    compiled = {c["backend"]: c for c in compiles}
    inputs = case_inputs(case)
    h = input_hash(inputs)
    full = cached_oracle(case, inputs)[0]
    oracle, scales = {n: full[n] for n in case.output_names()}, error_scales(full)
    wall = 0.0
    for i, item in enumerate(todo):
        spec, rec = as_spec(item), records[i]
        if spec.side == "oracle" or rec["status"] != "ok" or isinstance(backends[item], Exception):
            continue
        with _numerics_decided(compiled.get(spec.name)):
            result = execute(backends[item], case, inputs)
        wall += result.wall_time_s or 0.0
        rec["seeds"].append({"seed": case.seed, "input_hash": h})
        if result.status != "ok":
            rec.update(
                status=result.status,
                verdict=result.status,
                error=f"on input seed {case.seed} (further seed {len(rec['seeds']) - 1}): {result.error}",
            )
        else:
            for name, t in _tensor_records(case, result, oracle, scales, h).items():
                old = rec["tensors"].get(name)
                if old is None or old["verdict"] in UNJUDGED or t["verdict"] in UNJUDGED:
                    continue
                old["seeds"] += t["seeds"]
                if t["verdict"] != Verdict.PASS and old["verdict"] == Verdict.PASS:  # a later seed's tolerance or NaN
                    old["verdict"] = t["verdict"]
                    old["localisation"] = {**t.get("localisation", {}), "seed": case.seed}
            rec["verdict"] = _verdict(rec, rec["verdict"])
        records[i] = write_record(result_path(Path(out_dir), spec.name, rec["case_id"]), rec)
    return wall
