"""Result records: one JSON file per case and backend, written atomically.

    DIR/<backend>/<case_id>.json   kind "result": case, input hash, versions, platform,
                                   numerics, status, verdict, per-tensor metrics (parity.compare)
    DIR/<backend>/<case_id>.compile.json
                                   kind "compile": the candidate compiled for TPU targets
                                   (parity.tpu_compile), per target ok or Mosaic's error
    DIR/summary.json               kind "run": what ran, where, how long, one line per result
    DIR/gate.json                  kind "gate": the merged TPU <= GPU verdicts (parity.gate)
    DIR/manifest-<run_id>.json     kind "manifest": what a run was meant to write (parity.manifest)
Every record carries SCHEMA_VERSION; readers refuse other versions. A reader refuses
(RecordError) a file it cannot parse and a result record whose fields do not have the
types below, rather than skipping it: what the gate did not see is never a pass.
Non-finite floats are written as null and their paths listed in "encoded_nonfinite"; a
record that cannot be serialised at all is written as an error record saying why.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

from . import SCHEMA_VERSION


class TensorMetrics(TypedDict, total=False):
    """A candidate's or the reference's tensor against the oracle (parity.compare.compare_tensor);
    a tensor the backend does not return has only verdict "unsupported" and reason."""

    verdict: str  # one of VERDICT_ORDER
    reason: str  # why unsupported
    dtype: str
    shape: list[int]
    rel_rms: float | None  # ||x - r|| / ||r|| (rms((x - r) / error_scale) given one); null when NaN/Inf
    error_scale: list[float]  # dg_gamma: per head, what its error is measured against (references.error_scales)
    max_abs: float
    max_abs_over_rms: float | None
    max_ulp: float
    nan: int
    inf: int
    oracle_nonfinite: int
    oracle_rms: float
    oracle_max_abs: float
    floor_rel: float
    floor_abs: float
    tol: float  # parity.tol.tol(case, tensor)
    worst: list[dict]  # [{"index", "value", "oracle"}], worst first
    profile: list  # error per chunk along T (or per state row)
    heatmap: list
    row_heatmap: list
    sequences: list | None
    localisation: dict
    rms: float  # the oracle's own records: its rms and non-finite count
    nonfinite: int


class ResultRecord(TypedDict, total=False):
    """DIR/<backend>/<case_id>.json (kind "result"), checked on read by check_result."""

    schema: int
    kind: str  # "result"
    run_id: str
    case_id: str
    case: dict  # cases.Case.to_dict()
    input_hash: str | None
    oracle_version: Any
    tol_version: str
    backend: str  # BackendSpec.name
    side: str  # "oracle", "reference" or "candidate"
    host: str
    created: str  # %Y-%m-%dT%H:%M:%S%z: of two records the later wins (load_latest)
    repro: str  # the `parity run` command that reruns this case and backend
    status: str  # ok, error, timeout, unsupported
    verdict: str  # one of VERDICT_ORDER
    platform: str  # where it really ran, e.g. 'cpu:tpu-interpret'
    implementation: str
    versions: dict[str, str]
    numerics: str
    kernel_time_s: float | None
    wall_time_s: float | None
    error: str | None
    notes: dict[str, Any]
    tensors: dict[str, TensorMetrics]  # the oracle's: shape, rms, max_abs, nonfinite, verdict
    encoded_nonfinite: list[str]


class CompileRecord(TypedDict, total=False):
    """DIR/<backend>/<case_id>.compile.json (kind "compile", parity.tpu_compile), checked by check_compile."""

    schema: int
    kind: str  # "compile"
    run_id: str
    case_id: str
    case: dict
    backend: str
    created: str
    repro: str
    verdict: str  # pass, compile-error or numerics-mismatch (compile_verdict of targets)
    targets: dict[str, dict]  # target -> {"ok": bool, "error": str, "seconds", "mosaic", "numerics", ...}


ByCase = dict[str, dict[str, ResultRecord]]  # case_id -> backend -> record


# worst first: the verdict of a case is the worst verdict of its tensors
VERDICT_ORDER = (
    "error",
    "timeout",
    "compile-error",
    "numerics-mismatch",
    "nan-inf",
    "fail-accuracy",
    "fail-bound",
    "unsupported",
    "pass",
)


def worst_verdict(verdicts) -> str:
    verdicts = list(verdicts)
    return min(verdicts, key=VERDICT_ORDER.index) if verdicts else "pass"


class RecordError(ValueError):
    """A file under a run directory that cannot be read, or a record of the wrong shape;
    the message names the file and the field."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def write_json(path: Path, obj: Any) -> None:
    """Atomic write: a reader never sees half a file, and no .tmp-* file stays behind
    (the text is serialised before the temporary file exists). Mode as open() would give."""
    path = Path(path)
    text = json.dumps(obj, indent=1, allow_nan=False, default=_jsonable)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{os.getpid()}-", suffix=".json")
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def encode_nonfinite(obj: Any, path: str = "") -> tuple[Any, list[str]]:
    """obj with every NaN/Inf float replaced by None, and the paths replaced."""
    if isinstance(obj, float) or (hasattr(obj, "dtype") and getattr(obj, "shape", None) == ()):
        v = _jsonable(obj) if not isinstance(obj, float) else obj
        if isinstance(v, float) and not math.isfinite(v):
            return None, [path]
        return v, []
    if isinstance(obj, dict):
        out, paths = {}, []
        for k, v in obj.items():
            out[k], p = encode_nonfinite(v, f"{path}.{k}" if path else str(k))
            paths += p
        return out, paths
    if isinstance(obj, (list, tuple)):
        out, paths = [], []
        for i, v in enumerate(obj):
            e, p = encode_nonfinite(v, f"{path}[{i}]")
            out.append(e)
            paths += p
        return out, paths
    return obj, []


def write_record(path: Path, rec: ResultRecord) -> ResultRecord:
    """Write a result record: non-finite metrics encoded (null, listed in encoded_nonfinite);
    a record that still cannot be serialised becomes an error record saying why. Returns
    what was written."""
    rec, paths = encode_nonfinite(rec)
    if paths:
        rec["encoded_nonfinite"] = paths
    try:
        write_json(path, rec)
        return rec
    except (TypeError, ValueError, OverflowError, RecursionError) as e:
        why = f"the record could not be serialised: {type(e).__name__}: {e}"
    keep = (
        "schema",
        "kind",
        "run_id",
        "case_id",
        "case",
        "input_hash",
        "oracle_version",
        "tol_version",
        "backend",
        "side",
        "host",
        "created",
        "repro",
    )
    err = {k: rec[k] for k in keep if k in rec}
    err.update(
        status="error",
        verdict="error",
        tensors={},
        error=why,
        platform=str(rec.get("platform", "")),
        implementation=str(rec.get("implementation", "")),
        versions={},
        kernel_time_s=None,
        wall_time_s=None,
        notes={},
    )
    write_json(path, err)
    return err


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def read_checked(path: Path) -> Any:
    """A JSON file, or RecordError naming it (unreadable, not UTF-8, not JSON)."""
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise RecordError(f"{path}: unreadable: {type(e).__name__}: {str(e)[:200]}") from None


def result_path(out_dir: Path, backend: str, case_id: str, kind: str = "result") -> Path:
    return Path(out_dir) / backend / (f"{case_id}.json" if kind == "result" else f"{case_id}.{kind}.json")


def repro_command(case_id: str, backend_spec) -> str:
    """The one command that reruns just this case on just this backend (a BackendSpec or its
    text) and the oracle."""
    from .spec import as_spec

    cmd = ["parity", "run", "--case", case_id, *as_spec(backend_spec).cli_args()]
    return " ".join(shlex.quote(c) for c in cmd + ["--out", "repro"])


def base_record(case, backend_spec, backend: str, side: str, input_hash: str, run_id: str) -> ResultRecord:
    """The fields every result record starts with (backend_spec: a BackendSpec or its text)."""
    from references import ORACLE_VERSION

    from .tol import TOL_VERSION

    return {
        "schema": SCHEMA_VERSION,
        "kind": "result",
        "run_id": run_id,
        "case_id": case.id,
        "case": case.to_dict(),
        "input_hash": input_hash,
        "oracle_version": ORACLE_VERSION,
        "tol_version": TOL_VERSION,
        "backend": backend,
        "side": side,
        "host": socket.gethostname(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "repro": repro_command(case.id, backend_spec),
    }


def compile_repro_command(case_id: str, backend_spec, targets) -> str:
    from .spec import as_spec

    spec = as_spec(backend_spec)
    cmd = ["parity", "compile", "--case", case_id]
    cmd += ["--candidate", spec.text] if spec.is_candidate_spec else ["--backends", spec.text]
    return " ".join(shlex.quote(c) for c in cmd + ["--tpu-targets", ",".join(targets)])


def check_dirs(dirs: list[Path]) -> None:
    """RecordError unless every directory exists."""
    for d in dirs:
        if not Path(d).is_dir():
            raise RecordError(f"{d}: no such directory")


def iter_results(
    dirs: list[Path], skipped: list[str] | None = None, kind: str = "result"
) -> Iterator[tuple[Path, dict]]:
    """Every record of `kind` ("result", or "compile": parity.tpu_compile) under the given run
    directories (any depth), checked with check_result / check_compile. RecordError on a
    missing directory, an unreadable *.json file or a malformed record, unless a `skipped` list
    is given: then the file and why go there and reading goes on. JSON files of other kinds
    (summary, gate, manifest) are passed over."""
    check_dirs(dirs)
    for d in dirs:
        for path in sorted(Path(d).rglob("*.json")):
            if path.name.startswith(".tmp-") or not path.is_file():
                continue
            try:
                rec = read_checked(path)
                if not (isinstance(rec, dict) and rec.get("kind") == kind):
                    continue
                (check_result if kind == "result" else check_compile)(rec, path)
            except RecordError as e:
                if skipped is None:
                    raise
                skipped.append(str(e))
                continue
            yield path, rec


def newest(records) -> dict[str, dict[str, Any]]:
    """case_id -> backend -> record; of two records of the same case and backend the later
    ("created") wins."""
    by_case: dict[str, dict[str, dict]] = {}
    for rec in records:
        prev = by_case.setdefault(rec["case_id"], {}).get(rec["backend"])
        if prev is None or rec.get("created", "") >= prev.get("created", ""):
            by_case[rec["case_id"]][rec["backend"]] = rec
    return by_case


def load_latest(dirs: list[Path], kind: str = "result") -> dict[str, dict[str, ResultRecord | CompileRecord]]:
    """case_id -> backend -> newest record of `kind` ("result" or "compile") under `dirs`, read
    and checked by iter_results (RecordError on a missing directory, an unreadable file or a
    malformed record). No manifest check: that is the gate's (parity.gate.load_checked)."""
    return newest(rec for _, rec in iter_results(dirs, kind=kind))


# ------------------------------------------------------------------ the shape of a result record
_NUMBER_KEYS = (
    "rel_rms",
    "max_abs",
    "max_abs_over_rms",
    "max_ulp",
    "oracle_rms",
    "oracle_max_abs",
    "floor_rel",
    "floor_abs",
    "tol",
    "rms",
)
_COUNT_KEYS = ("nan", "inf", "oracle_nonfinite", "nonfinite")
_GRID_KEYS = ("profile", "heatmap", "row_heatmap", "sequences")


def field_error(path, field: str, value, allowed: str):
    """Raise the RecordError of a bad field: the file, the field, its value, what is allowed."""
    raise RecordError(f"{path}: field {field}={str(value)[:80]!r} is invalid: expected {allowed}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _grid_ok(v) -> bool:
    if v is None or _is_number(v):
        return True
    return isinstance(v, list) and all(_grid_ok(x) for x in v)


def check_compile(rec: dict, path: Path | str = "record") -> None:
    """RecordError unless a compile record has what the gate and the report read: schema,
    case, backend, per target `ok` (a bool) and, when not ok, an error, and the verdict those
    targets imply (tpu_compile.compile_verdict): readers then trust the verdict field."""
    if rec.get("schema") != SCHEMA_VERSION:
        raise RecordError(f"{path}: schema {rec.get('schema')!r}, this reader reads schema {SCHEMA_VERSION}")
    for f in ("case_id", "backend", "created", "run_id", "repro"):
        if not isinstance(rec.get(f), str):
            field_error(path, f, rec.get(f), "a string")
    if rec.get("verdict") not in ("pass", "compile-error", "numerics-mismatch"):
        field_error(path, "verdict", rec.get("verdict"), "one of ['pass', 'compile-error', 'numerics-mismatch']")
    targets = rec.get("targets")
    if not isinstance(targets, dict) or not targets:
        field_error(path, "targets", targets, "an object of target -> compile result")
    for t, r in targets.items():
        if not isinstance(r, dict) or not isinstance(r.get("ok"), bool):
            field_error(path, f"targets.{t}.ok", (r or {}).get("ok") if isinstance(r, dict) else r, "true or false")
        if not r["ok"] and not isinstance(r.get("error"), str):
            field_error(path, f"targets.{t}.error", r.get("error"), "a string (the compiler's message)")
    from .tpu_compile import compile_verdict

    implied = compile_verdict(targets)
    if rec["verdict"] != implied:
        field_error(path, "verdict", rec["verdict"], f"{implied!r}, the verdict its targets imply")


def check_result(rec: dict, path: Path | str = "record") -> None:
    """RecordError (naming the file and field) unless `rec` has the fields the gate, the
    report and calibrate read, with their types: numbers finite or null, counts ints,
    verdicts and statuses known, the case a valid Case. (That case_id is the case's id and
    the file's name is the gate's check, parity.gate: the report shows any string safely.)"""
    from cases import Case, CaseError

    from .backends.base import STATUSES
    from .spec import SIDES

    def bad(field, value, allowed):
        field_error(path, field, value, allowed)

    if rec.get("schema") != SCHEMA_VERSION:
        raise RecordError(f"{path}: schema {rec.get('schema')!r}, this reader reads schema {SCHEMA_VERSION}")
    for f in ("case_id", "backend", "created", "run_id", "repro"):
        if not isinstance(rec.get(f), str):
            bad(f, rec.get(f), "a string")
    for f in ("input_hash", "platform", "implementation", "error"):
        if rec.get(f) is not None and not isinstance(rec.get(f), str):
            bad(f, rec.get(f), "a string or null")
    if rec.get("side") not in SIDES:
        bad("side", rec.get("side"), f"one of {list(SIDES)}")
    if rec.get("status") not in STATUSES:
        bad("status", rec.get("status"), f"one of {list(STATUSES)}")
    if rec.get("verdict") not in VERDICT_ORDER:
        bad("verdict", rec.get("verdict"), f"one of {list(VERDICT_ORDER)}")
    for f in ("kernel_time_s", "wall_time_s"):
        if rec.get(f) is not None and not _is_number(rec[f]):
            bad(f, rec[f], "a finite number or null")
    for f in ("versions", "notes"):
        if not isinstance(rec.get(f, {}), dict):
            bad(f, rec[f], "an object")
    if not isinstance(rec.get("case"), dict):
        bad("case", rec.get("case"), "a case object")
    try:
        Case.from_dict(rec["case"])
    except (CaseError, TypeError) as e:
        bad("case", rec["case"], f"a valid case ({e})")
    tensors = rec.get("tensors")
    if not isinstance(tensors, dict):
        bad("tensors", tensors, "an object of tensor name -> metrics")
    for name, t in tensors.items():
        if not isinstance(t, dict):
            bad(f"tensors.{name}", t, "an object of metrics")
        if t.get("verdict") not in VERDICT_ORDER:
            bad(f"tensors.{name}.verdict", t.get("verdict"), f"one of {list(VERDICT_ORDER)}")
        for k in _NUMBER_KEYS:
            if t.get(k) is not None and not _is_number(t[k]):
                bad(f"tensors.{name}.{k}", t[k], "a finite number or null")
        for k in _COUNT_KEYS:
            if k in t and not (isinstance(t[k], int) and not isinstance(t[k], bool) and t[k] >= 0):
                bad(f"tensors.{name}.{k}", t[k], "a count (int >= 0)")
        for k in _GRID_KEYS:
            if not _grid_ok(t.get(k)):
                bad(f"tensors.{name}.{k}", t[k], "nested lists of finite numbers or null")
        for k in ("worst", "localisation"):
            if k in t and not isinstance(t[k], (list, dict)):
                bad(f"tensors.{name}.{k}", t[k], "a list or object")
