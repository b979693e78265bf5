"""Result records: one JSON file per case and backend, written atomically.

    DIR/<backend>/<case_id>.json   kind "result": case, input hash, versions, platform,
                                   numerics, status, verdict, per-tensor metrics (parity.compare)
    DIR/<backend>/<case_id>.compile.json
                                   kind "compile": the candidate compiled for TPU targets
                                   (parity.tpu_compile), per target ok or Mosaic's error
    DIR/summary.json               kind "run": what ran, where, how long, one line per result
    DIR/gate.json                  kind "gate": the merged TPU <= GPU verdicts (parity.gate)
Every record carries SCHEMA_VERSION; readers refuse other versions.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from . import SCHEMA_VERSION

# worst first: the verdict of a case is the worst verdict of its tensors
VERDICT_ORDER = ("error", "timeout", "compile-error", "numerics-mismatch", "nan-inf", "fail-accuracy", "fail-bound",
                 "unsupported", "pass")


def worst_verdict(verdicts) -> str:
    verdicts = list(verdicts)
    return min(verdicts, key=VERDICT_ORDER.index) if verdicts else "pass"


def write_json(path: Path, obj: Any) -> None:
    """Atomic write: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, allow_nan=False, default=_jsonable)
    os.replace(tmp, path)


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def result_path(out_dir: Path, backend: str, case_id: str, kind: str = "result") -> Path:
    return Path(out_dir) / backend / (f"{case_id}.json" if kind == "result" else f"{case_id}.{kind}.json")


def repro_command(case_id: str, backend_spec: str) -> str:
    """The one command that reruns just this case on just this backend (and the oracle)."""
    cmd = ["parity", "run", "--case", case_id]
    if "=" in backend_spec:
        cmd += ["--backends", "oracle", "--candidate", backend_spec]
    else:
        cmd += ["--backends", "oracle" if backend_spec == "oracle" else f"oracle,{backend_spec}"]
    return " ".join(shlex.quote(c) for c in cmd + ["--out", "repro"])


def base_record(case, backend_spec: str, backend: str, side: str, input_hash: str, run_id: str) -> dict:
    from references import ORACLE_VERSION

    from .tol import TOL_VERSION
    return {
        "schema": SCHEMA_VERSION, "kind": "result", "run_id": run_id, "case_id": case.id,
        "case": case.to_dict(), "input_hash": input_hash, "oracle_version": ORACLE_VERSION,
        "tol_version": TOL_VERSION, "backend": backend, "side": side, "host": socket.gethostname(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "repro": repro_command(case.id, backend_spec),
    }


def compile_repro_command(case_id: str, backend_spec: str, targets) -> str:
    cmd = ["parity", "compile", "--case", case_id]
    cmd += ["--candidate", backend_spec] if "=" in backend_spec else ["--backends", backend_spec]
    return " ".join(shlex.quote(c) for c in cmd + ["--tpu-targets", ",".join(targets)])


def iter_results(dirs: list[Path], kind: str = "result") -> Iterator[tuple[Path, dict]]:
    """Every record of `kind` ("result" or "compile") under the given run directories (any depth)."""
    for d in dirs:
        for path in sorted(Path(d).rglob("*.json")):
            if path.name.startswith(".tmp-"):
                continue
            try:
                rec = read_json(path)
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(rec, dict) and rec.get("kind") == kind:
                yield path, rec
