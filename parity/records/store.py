"""Writing and reading records: atomic JSON files, non-finite floats encoded, the fields every
result record starts with, its path and repro command, and the newest record per case and backend."""

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
from typing import Any

from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN
from parity.measure.tol import TOL_VERSION
from parity.model.spec import as_spec
from parity.records.checks import check_compile, check_result
from parity.records.schema import SCHEMA_VERSION, CompileRecord, RecordError, ResultRecord
from references.version import ORACLE_VERSION


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


def repro_command(case_id: str, backend_spec, seeds: tuple[int, int] | None = None) -> str:
    """The one command that reruns just this case on this backend (a BackendSpec or its text)
    with the oracle and, for a candidate, the reference (fla): `parity run` then gates the pair
    itself, so the command prints the verdict the record was judged with and exits 1 on a
    failure. `seeds`: the run's seed policy (min, max), passed on when it is not the default.
    Run from the directory the original run was made in (a candidate's module is imported
    from there); its output goes to repro/<backend>/<case_id>, a directory of its own."""
    spec = as_spec(backend_spec)
    cmd = ["parity", "run", "--case", case_id, *spec.cli_args()]
    if seeds is not None and tuple(seeds) != (SEEDS_MIN, SEEDS_MAX):
        cmd += ["--seeds", f"{seeds[0]}:{seeds[1]}"]
    return " ".join(shlex.quote(c) for c in cmd + ["--out", f"repro/{spec.name}/{case_id}"])


def base_record(case, backend_spec, backend: str, side: str, input_hash: str, run_id: str) -> ResultRecord:
    """The fields every result record starts with (backend_spec: a BackendSpec or its text)."""
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


def compile_repro_command(case_id: str, backend_spec, targets, out_dir: Path | None = None) -> str:
    """`parity compile` of this one case and candidate alone (a --candidate compiles without the
    built-in kernels), for the targets, into `out_dir` (the run's own directory) where given."""
    spec = as_spec(backend_spec)
    cmd = ["parity", "compile", "--case", case_id]
    cmd += ["--candidate", spec.text] if spec.is_candidate_spec else ["--backends", spec.text]
    cmd += ["--tpu-targets", ",".join(targets)] + (["--out", str(out_dir)] if out_dir is not None else [])
    return " ".join(shlex.quote(c) for c in cmd)


def check_dirs(dirs: list[Path]) -> None:
    """RecordError unless every directory exists."""
    for d in dirs:
        if not Path(d).is_dir():
            raise RecordError(f"{d}: no such directory")


def iter_results(
    dirs: list[Path], skipped: list[str] | None = None, kind: str = "result", run_id: str | None = None
) -> Iterator[tuple[Path, dict]]:
    """Every record of `kind` ("result", or "compile": parity.execute.tpu_compile) under the given run
    directories (any depth), checked with check_result / check_compile; given `run_id`, only that
    run's records (others, e.g. an older version's in the same directory, are not read further).
    RecordError on a missing directory, an unreadable *.json file or a malformed record, unless a
    `skipped` list is given: then the file and why go there and reading goes on. JSON files of
    other kinds (summary, gate, manifest) are passed over."""
    check_dirs(dirs)
    for d in dirs:
        for path in sorted(Path(d).rglob("*.json")):
            if path.name.startswith(".tmp-") or not path.is_file():
                continue
            try:
                rec = read_checked(path)
                if not (isinstance(rec, dict) and rec.get("kind") == kind):
                    continue
                if run_id is not None and rec.get("run_id") != run_id:
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
    malformed record). No manifest check: that is the gate's (parity.judge.load.load_checked)."""
    return newest(rec for _, rec in iter_results(dirs, kind=kind))
