"""What the gate reads: the records its directories' manifests list, checked against them
(missing, unreadable, misplaced or of other inputs: GateRefusal), and what it could not see."""

from __future__ import annotations

from pathlib import Path

from cases import Case
from parity.records import ByCase, RecordError, iter_results, load_latest, newest
from parity.records.manifest import expected_compiles, expected_records, find_manifests


class GateRefusal(Exception):
    """The inputs cannot be compared; the message says why."""


def load(dirs: list[Path]) -> ByCase:
    """case_id -> backend -> newest result record under `dirs` (records.load_latest) without the
    manifest check (parity.mutants reads the run it just made). GateRefusal on an unreadable or
    malformed record."""
    try:
        return load_latest(dirs)
    except RecordError as e:
        raise GateRefusal(str(e)) from None


def load_checked(dirs: list[Path], allow_partial: bool = False) -> tuple[dict, dict, dict]:
    """(case_id -> backend -> result record, case_id -> backend -> compile record) of the
    records the directories' manifests list, and what the gate could not see: {"missing":
    [...], "skipped": [...], "ignored": n, "no_manifest": [...]}. GateRefusal on anything
    unseen unless allow_partial (then every readable record counts)."""
    skipped: list[str] | None = [] if allow_partial else None
    try:
        found = {p.resolve(): rec for p, rec in iter_results(dirs, skipped)}
        found_compiles = {p.resolve(): rec for p, rec in iter_results(dirs, skipped, kind="compile")}
    except RecordError as e:
        raise GateRefusal(f"{e} (--allow-partial to gate the readable records only)") from None
    used_compiles: set[Path] = set()
    used: set[Path] = set()
    missing, no_manifest = [], []
    for d in dirs:
        try:
            manifests = find_manifests(Path(d))
        except RecordError as e:
            if not allow_partial:
                raise GateRefusal(str(e)) from None
            skipped.append(str(e))
            manifests = []
        if not manifests:
            no_manifest.append(str(d))
            if not allow_partial:
                raise GateRefusal(
                    f"{d}: no manifest (manifest-*.json) says which cases it should hold; "
                    "`parity run` and the pytest plugin write one (--allow-partial to gate its records anyway)"
                )
            root = Path(d).resolve()
            for p in found:
                if root in p.parents and Case.from_dict(found[p]["case"]).id == found[p]["case_id"]:
                    used.add(p)
                elif root in p.parents:
                    skipped.append(f"{p}: case_id {found[p]['case_id']!r} is not the id of its case")
            used_compiles |= {p for p in found_compiles if root in p.parents}
        for mpath, m in manifests:
            hashes = {c["id"]: c.get("input_hash") for c in m["cases"]}
            for case_id, backend, rpath in expected_records(mpath, m):
                rpath = rpath.resolve()
                if rpath not in found:
                    missing.append(f"{case_id} [{backend}] ({mpath.name})")
                    continue
                rec = found[rpath]
                if (rec["case_id"], rec["backend"]) != (case_id, backend) or Case.from_dict(rec["case"]).id != case_id:
                    raise GateRefusal(
                        f"{rpath}: holds case {rec['case_id']!r} [{rec['backend']}], "
                        f"not {case_id!r} [{backend}] as its place and manifest say"
                    )
                if hashes.get(case_id) and rec["input_hash"] != hashes[case_id]:
                    raise GateRefusal(
                        f"{rpath}: input_hash {str(rec['input_hash'])[:16]} differs from the one its "
                        f"manifest {mpath.name} recorded ({hashes[case_id][:16]})"
                    )
                used.add(rpath)
            for case_id, backend, cpath in expected_compiles(mpath, m, found):
                rec = found_compiles.get(cpath.resolve())
                if rec is None:
                    missing.append(f"{case_id} [{backend}] TPU compile ({mpath.name})")
                    continue
                if (rec["case_id"], rec["backend"]) != (case_id, backend):
                    raise GateRefusal(
                        f"{cpath}: holds the compile of {rec['case_id']!r} [{rec['backend']}], "
                        f"not {case_id!r} [{backend}] as its place and manifest say"
                    )
                absent = [t for t in m.get("tpu_targets") or [] if t not in rec["targets"]]
                if absent:
                    missing.append(f"{case_id} [{backend}] TPU compile for {', '.join(absent)} ({mpath.name})")
                    continue
                used_compiles.add(cpath.resolve())
    if missing and not allow_partial:
        raise GateRefusal(
            f"{len(missing)} record(s) a manifest lists are missing, e.g. {'; '.join(missing[:3])} "
            "(--allow-partial to gate the others)"
        )
    coverage = {
        "partial": allow_partial,
        "missing": missing,
        "skipped": skipped or [],
        "no_manifest": no_manifest,
        "ignored": len(found) - len(used) + len(found_compiles) - len(used_compiles),
    }
    return (newest(found[p] for p in sorted(used)), newest(found_compiles[p] for p in sorted(used_compiles)), coverage)


def load_compiles(dirs: list[Path]) -> dict[str, dict[str, dict]]:
    """case_id -> backend -> compile record, as `load` reads results (no manifest check; records
    checked by records.check_compile, schema included); GateRefusal on a bad one."""
    try:
        return load_latest(dirs, kind="compile")
    except RecordError as e:
        raise GateRefusal(str(e)) from None
