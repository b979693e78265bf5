"""Run manifests: what a run was meant to write, so that a missing record is seen.

    DIR/manifest-<run_id>.json   kind "manifest": schema, run_id, writer ('parity run',
        'pytest'), created, versions (oracle, tolerances), backends (record folder names),
        cases ([{id, input_hash}], the hash null until the case ran), completed ([case_id,
        backend] pairs whose record was written), finished (the run ended by itself) and
        interrupted (SIGINT or SIGTERM); tpu_targets (the TPU targets every candidate that ran
        must have a compile record for: DIR/<backend>/<case_id>.compile.json) and, for
        `parity compile` (which writes no result records), compiles ([case_id, backend] pairs
        it was meant to compile); pairs ([case_id, backend] pairs), present when the run was
        not every case through every backend (`parity mutants` stops a mutant at the first
        case that catches it): exactly the records it planned, each case in cases and each
        backend in backends.

Every writer of records writes one: `parity run` before its first worker starts and again
at the end, the pytest plugin at collection. `parity gate` checks every manifest under a
directory against the records beside it: DIR/<backend>/<case_id>.json must exist and be a
readable result record of that case and backend for each one listed, with the input hash
the manifest recorded (parity.judge.load.load_checked).
"""

from __future__ import annotations

import time
from pathlib import Path

from cases import Case, CaseError
from parity.measure.tol import TOL_VERSION
from parity.model.spec import NAME_RE
from parity.model.targets import TARGETS
from parity.records.checks import field_error
from parity.records.schema import SCHEMA_VERSION, RecordError
from parity.records.store import read_checked, write_json
from references.version import ORACLE_VERSION


def manifest_path(out_dir: Path, run_id: str) -> Path:
    return Path(out_dir) / f"manifest-{run_id}.json"


def write_manifest(
    out_dir: Path,
    run_id: str,
    writer: str,
    case_ids: list[str],
    backends: list[str],
    input_hashes: dict[str, str] | None = None,
    completed=(),
    finished: bool = False,
    interrupted: bool = False,
    tpu_targets=(),
    compiles=(),
    pairs=None,
) -> Path:
    """Write DIR/manifest-<run_id>.json; `pairs` None: every case through every backend."""
    hashes = input_hashes or {}
    path = manifest_path(out_dir, run_id)
    write_json(
        path,
        {
            "schema": SCHEMA_VERSION,
            "kind": "manifest",
            "run_id": run_id,
            "writer": writer,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "versions": {"schema": SCHEMA_VERSION, "oracle": ORACLE_VERSION, "tol": TOL_VERSION},
            "backends": list(backends),
            "cases": [{"id": c, "input_hash": hashes.get(c)} for c in case_ids],
            "completed": sorted([list(p) for p in completed]),
            "finished": finished,
            "interrupted": interrupted,
            "tpu_targets": list(tpu_targets),
            "compiles": sorted([list(p) for p in compiles]),
            **({} if pairs is None else {"pairs": [list(p) for p in pairs]}),
        },
    )
    return path


def check_manifest(m, path: Path) -> dict:
    """The manifest, or RecordError naming the file and the field."""

    def bad(field, value, allowed):
        field_error(path, field, value, allowed)

    if not isinstance(m, dict) or m.get("kind") != "manifest":
        bad("kind", m.get("kind") if isinstance(m, dict) else m, "'manifest'")
    if m.get("schema") != SCHEMA_VERSION:
        raise RecordError(f"{path}: schema {m.get('schema')!r}, this reader reads schema {SCHEMA_VERSION}")
    backends = m.get("backends")
    if not isinstance(backends, list) or not all(isinstance(b, str) and NAME_RE.fullmatch(b) for b in backends):
        bad("backends", backends, "a list of backend names")
    cases = m.get("cases")
    if not isinstance(cases, list) or not all(
        isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("input_hash"), (str, type(None)))
        for c in cases
    ):
        bad("cases", cases, "a list of {id, input_hash: a string or null}")
    for c in cases:
        try:
            Case.from_id(c["id"])
        except CaseError as e:
            bad("cases", c["id"], f"case ids ({e})")
    if not isinstance(m.get("tpu_targets", []), list) or not all(t in TARGETS for t in m.get("tpu_targets", [])):
        bad("tpu_targets", m.get("tpu_targets"), f"a list of TPU targets from {list(TARGETS)}")
    pairs = m.get("compiles", [])
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) and NAME_RE.fullmatch(p[1])
        for p in pairs
    ):
        bad("compiles", pairs, "a list of [case_id, backend] pairs")
    if "pairs" in m:
        ids, names = {c["id"] for c in cases}, set(backends)
        pairs = m["pairs"]
        if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and p[0] in ids and p[1] in names for p in pairs
        ):
            bad("pairs", pairs, "a list of [case_id, backend] pairs of its cases and backends")
    return m


def find_manifests(d: Path) -> list[tuple[Path, dict]]:
    """Every manifest under `d` (any depth), checked; RecordError on a bad one."""
    return [(p, check_manifest(read_checked(p), p)) for p in sorted(Path(d).rglob("manifest-*.json")) if p.is_file()]


def expected_records(path: Path, m: dict) -> list[tuple[str, str, Path]]:
    """(case_id, backend, result record path) for everything the manifest at `path` lists
    (none for `parity compile`, which executes nothing: its records are expected_compiles)."""
    if m.get("writer") == "parity compile":
        return []
    if "pairs" in m:
        return [(c, b, path.parent / b / f"{c}.json") for c, b in dict.fromkeys(map(tuple, m["pairs"]))]
    return [(c["id"], b, path.parent / b / f"{c['id']}.json") for c in m["cases"] for b in m["backends"]]


def expected_compiles(path: Path, m: dict, results: dict[Path, dict]) -> list[tuple[str, str, Path]]:
    """(case_id, backend, compile record path) for every TPU compile the manifest at `path`
    implies: the pairs `parity compile` lists, and, in a run with tpu_targets, every candidate
    whose result record (in `results`, by resolved path) ran the case to the end (status ok:
    a candidate that failed or timed out fails on its record already) and has a TPU program (not
    one whose notes say "no_tpu_program": the noise:REL test backend)."""
    pairs = [tuple(p) for p in m.get("compiles", [])]
    if m.get("tpu_targets"):
        for case_id, backend, rpath in expected_records(path, m):
            rec = results.get(rpath.resolve())
            if (
                rec
                and rec.get("side") == "candidate"
                and rec.get("status") == "ok"
                and not rec.get("notes", {}).get("no_tpu_program")
            ):
                pairs.append((case_id, backend))
    return [(c, b, path.parent / b / f"{c}.compile.json") for c, b in dict.fromkeys(pairs)]
