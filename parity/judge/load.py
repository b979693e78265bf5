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
    found, found_compiles = _read_all(dirs, skipped)
    used: set[Path] = set()
    used_compiles: set[Path] = set()
    missing: list[str] = []
    no_manifest: list[str] = []
    for d in dirs:
        manifests = _manifests(Path(d), skipped)
        if not manifests:
            no_manifest.append(str(d))
            if not allow_partial:
                raise GateRefusal(
                    f"{d}: no manifest (manifest-*.json) says which cases it should hold; "
                    "`parity run` and the pytest plugin write one (--allow-partial to gate its records anyway)"
                )
            used |= _unlisted_records(Path(d), found, skipped)
            used_compiles |= {p for p in found_compiles if Path(d).resolve() in p.parents}
        for mpath, m in manifests:
            used |= _listed_records(mpath, m, found, missing)
            used_compiles |= _listed_compiles(mpath, m, found, found_compiles, missing)
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


def _read_all(dirs: list[Path], skipped: list[str] | None) -> tuple[dict[Path, dict], dict[Path, dict]]:
    """(path -> result record, path -> compile record) of every record under `dirs`; an unreadable
    one is listed in `skipped` when there is such a list (allow_partial), else GateRefusal."""
    try:
        found = {p.resolve(): rec for p, rec in iter_results(dirs, skipped)}
        found_compiles = {p.resolve(): rec for p, rec in iter_results(dirs, skipped, kind="compile")}
    except RecordError as e:
        raise GateRefusal(f"{e} (--allow-partial to gate the readable records only)") from None
    return found, found_compiles


def _manifests(d: Path, skipped: list[str] | None) -> list[tuple[Path, dict]]:
    """The directory's manifests; an unreadable one: listed in `skipped` (allow_partial), else GateRefusal."""
    try:
        return find_manifests(d)
    except RecordError as e:
        if skipped is None:
            raise GateRefusal(str(e)) from None
        skipped.append(str(e))
        return []


def _unlisted_records(d: Path, found: dict[Path, dict], skipped: list[str]) -> set[Path]:
    """The result records under a directory without a manifest (allow_partial) whose case_id is
    their case's id; the others are listed in `skipped`."""
    root, used = d.resolve(), set()
    for p, rec in found.items():
        if root in p.parents and Case.from_dict(rec["case"]).id == rec["case_id"]:
            used.add(p)
        elif root in p.parents:
            skipped.append(f"{p}: case_id {rec['case_id']!r} is not the id of its case")
    return used


def _listed_records(mpath: Path, m: dict, found: dict[Path, dict], missing: list[str]) -> set[Path]:
    """The result records manifest `m` lists that are there (the absent ones appended to
    `missing`); GateRefusal on one that holds another case or backend, or other inputs."""
    hashes = {c["id"]: c.get("input_hash") for c in m["cases"]}
    used = set()
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
    return used


def _listed_compiles(
    mpath: Path, m: dict, found: dict[Path, dict], found_compiles: dict[Path, dict], missing: list[str]
) -> set[Path]:
    """The compile records manifest `m` expects (one per candidate record that ran, covering every
    TPU target it lists) that are there; the absent or incomplete ones appended to `missing`;
    GateRefusal on one that holds another case or backend."""
    used = set()
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
        used.add(cpath.resolve())
    return used


def load_compiles(dirs: list[Path]) -> dict[str, dict[str, dict]]:
    """case_id -> backend -> compile record, as `load` reads results (no manifest check; records
    checked by records.check_compile, schema included); GateRefusal on a bad one."""
    try:
        return load_latest(dirs, kind="compile")
    except RecordError as e:
        raise GateRefusal(str(e)) from None
