"""A search's minimal failing case, kept: its records, manifest and repro bundle under
OUT/found/<case_id>/, and its case dict in OUT/found.json (read_found, append_found)."""

from __future__ import annotations

import shutil
from pathlib import Path

from cases import Case, CaseError, load_cases_file
from parity.execute.backends import backend_name
from parity.fuzz.config import FuzzConfig
from parity.model.spec import REFERENCE
from parity.records import read_json, result_path, write_json
from parity.records.manifest import write_manifest
from parity.repro import write_repro

FOUND_FILE = "found.json"


def save_found(cfg: FuzzConfig, search: dict) -> dict:
    """For a search's minimal failing case: its records and a manifest in OUT/found/<id>/, the
    repro bundle in OUT/found/<id>/repro/, and its case dict appended to OUT/found.json."""

    case = Case.from_id(search["minimal"])
    dest = Path(cfg.out) / "found" / case.id
    names = []
    for spec in cfg.specs:
        name = backend_name(spec)
        src = result_path(Path(search["work"]), name, case.id)
        if src.exists():
            result_path(dest, name, case.id).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, result_path(dest, name, case.id))
            names.append(name)
    oracle = result_path(dest, "oracle", case.id)
    hashes = {case.id: read_json(oracle).get("input_hash")} if oracle.exists() else {}
    write_manifest(
        dest, "fuzz", "parity fuzz", [case.id], names, hashes, completed={(case.id, n) for n in names}, finished=True
    )
    subject = cfg.candidate or REFERENCE
    try:
        ref = result_path(dest, REFERENCE, case.id)  # the bound's figures, where the reference ran
        bounded = REFERENCE in names and read_json(ref)["status"] == "ok"
        write_repro(case, subject, dest / "repro", reference=dest if bounded else None)
        repro = str(dest / "repro")
    except (ValueError, KeyError) as e:
        repro = f"not written: {e}"
    append_found(Path(cfg.out) / FOUND_FILE, case)
    return {
        "case_id": case.id,
        "op": case.op,
        "subject": search["subject"],
        "verdict": search["minimal_verdict"],
        "detail": search["minimal_detail"],
        "records": str(dest),
        "repro": repro,
        "time_to_find_s": search["time_to_find_s"],
        "seed": search["seed"],
    }


def read_found(path: Path) -> list[dict]:
    """OUT/found.json's case dicts ([] when absent); ValueError naming the file when it is not
    a JSON list of valid case dicts."""

    if not path.exists():
        return []
    try:
        cases = load_cases_file(path)
    except CaseError as e:
        raise ValueError(f"{path} is not a list of cases `parity run --cases` reads: {e}") from None
    return [c.to_dict() for c in cases]


def append_found(path: Path, case: Case) -> None:
    found = read_found(path)
    if case.to_dict() not in found:
        found.append(case.to_dict())
    write_json(path, found)
