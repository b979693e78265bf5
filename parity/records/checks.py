"""The checks a reader makes of a record before trusting it: each field of a result or compile
record has the type the gate, the report and calibrate read, else RecordError names the file and field."""

from __future__ import annotations

import math
from pathlib import Path

from cases import Case, CaseError
from parity.model.spec import SIDES, STATUSES
from parity.model.verdict import Verdict
from parity.records.schema import SCHEMA_VERSION, RecordError, compile_verdict

_VERDICTS = [str(v) for v in Verdict]  # as a record holds them, worst first
_COMPILE_VERDICTS = (Verdict.PASS, Verdict.COMPILE_ERROR, Verdict.NUMERICS_MISMATCH)
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
    case, backend, per target `ok` (a bool) and, when not ok, an error (and an out-of-VMEM
    failure's summary, which the gate prints), and the verdict those targets imply
    (tpu_compile.compile_verdict): readers then trust the verdict field."""
    if rec.get("schema") != SCHEMA_VERSION:
        raise RecordError(f"{path}: schema {rec.get('schema')!r}, this reader reads schema {SCHEMA_VERSION}")
    for f in ("case_id", "backend", "created", "run_id", "repro"):
        if not isinstance(rec.get(f), str):
            field_error(path, f, rec.get(f), "a string")
    if rec.get("verdict") not in _COMPILE_VERDICTS:
        field_error(path, "verdict", rec.get("verdict"), f"one of {[str(v) for v in _COMPILE_VERDICTS]}")
    targets = rec.get("targets")
    if not isinstance(targets, dict) or not targets:
        field_error(path, "targets", targets, "an object of target -> compile result")
    for t, r in targets.items():
        if not isinstance(r, dict) or not isinstance(r.get("ok"), bool):
            field_error(path, f"targets.{t}.ok", (r or {}).get("ok") if isinstance(r, dict) else r, "true or false")
        if not r["ok"] and not isinstance(r.get("error"), str):
            field_error(path, f"targets.{t}.error", r.get("error"), "a string (the compiler's message)")
        if "vmem" in r and not (isinstance(r["vmem"], dict) and isinstance(r["vmem"].get("summary"), str)):
            field_error(path, f"targets.{t}.vmem", r["vmem"], "an object with a summary string")
    implied = compile_verdict(targets)
    if rec["verdict"] != implied:
        field_error(path, "verdict", rec["verdict"], f"{str(implied)!r}, the verdict its targets imply")


def check_result(rec: dict, path: Path | str = "record") -> None:
    """RecordError (naming the file and field) unless `rec` has the fields the gate, the
    report and calibrate read, with their types: numbers finite or null, counts ints,
    verdicts and statuses known, the case a valid Case. (That case_id is the case's id and
    the file's name is the gate's check, parity.judge.load: the report shows any string safely.)"""

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
    if rec.get("verdict") not in _VERDICTS:
        bad("verdict", rec.get("verdict"), f"one of {_VERDICTS}")
    for f in ("kernel_time_s", "wall_time_s"):
        if rec.get(f) is not None and not _is_number(rec[f]):
            bad(f, rec[f], "a finite number or null")
    for f in ("versions", "notes"):
        if not isinstance(rec.get(f, {}), dict):
            bad(f, rec[f], "an object")
    _check_fla_notes(rec.get("notes", {}), bad)
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
        if t.get("verdict") not in _VERDICTS:
            bad(f"tensors.{name}.verdict", t.get("verdict"), f"one of {_VERDICTS}")
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
        if "seeds" in t:
            _check_seeds(t["seeds"], f"tensors.{name}.seeds", bad)


def _strings(d, keys) -> bool:
    return isinstance(d, dict) and all(isinstance(d.get(k), str) for k in keys)


def _check_refusal(refusal, field: str, bad) -> None:
    if not (_strings(refusal, ("issue", "cause", "fix")) and isinstance(refusal.get("environment"), bool)):
        bad(field, refusal, 'an object with strings "issue", "cause", "fix" and a bool "environment"')


def _check_fla_notes(notes: dict, bad) -> None:
    """The notes the gate reads about the reference's environment (parity.judge.environment), when
    present: refusal, known_wrong, fla_launches, fallback. Malformed, they would hide a cause."""
    if "refusal" in notes:
        _check_refusal(notes["refusal"], "notes.refusal", bad)
    wrong = notes.get("known_wrong") if notes.get("known_wrong") is not None else []
    if not isinstance(wrong, list):
        bad("notes.known_wrong", wrong, "a list of known-wrong entries")
    for i, e in enumerate(wrong):
        tensors = e.get("tensors") if isinstance(e, dict) else None
        if not (_strings(e, ("issue", "kernel", "why", "fix")) and isinstance(tensors, list)):
            bad(f"notes.known_wrong[{i}]", e, 'an object with strings "issue", "kernel", "why", "fix" and "tensors"')
        if not all(isinstance(t, str) for t in tensors):
            bad(f"notes.known_wrong[{i}].tensors", tensors, "a list of tensor names")
    launches = notes.get("fla_launches") if notes.get("fla_launches") is not None else []  # null: not recorded
    if not isinstance(launches, list):
        bad("notes.fla_launches", launches, "a list of kernel launches")
    for i, x in enumerate(launches):
        if not (_strings(x, ("kernel", "module")) and isinstance(x.get("meta", {}), dict)):
            bad(f"notes.fla_launches[{i}]", x, 'an object with strings "kernel", "module" and an object "meta"')
        warps = x.get("num_warps")
        if warps is not None and (not isinstance(warps, int) or isinstance(warps, bool)):
            bad(f"notes.fla_launches[{i}].num_warps", warps, "an int or null")
    if "fallback" in notes:
        fb = notes["fallback"]
        if not _strings(fb, ("from",)):
            bad("notes.fallback", fb, 'an object with a string "from" (the platform that refused)')
        if "refusal" in fb:
            _check_refusal(fb["refusal"], "notes.fallback.refusal", bad)


def _check_seeds(seeds, field: str, bad) -> None:
    """A tensor's per-seed figures (parity.execute.case): a list of {"seed": int, "err2": [numbers],
    "floor2": [numbers]} with as many err2 as floor2 blocks, the same count on every seed."""
    if not isinstance(seeds, list):
        bad(field, seeds, "a list of per-seed figures")
    sizes = set()
    for i, s in enumerate(seeds):
        if not isinstance(s, dict) or not isinstance(s.get("seed"), int) or isinstance(s.get("seed"), bool):
            bad(f"{field}[{i}]", s, 'an object with an int "seed"')
        for k in ("err2", "floor2"):
            if not (isinstance(s.get(k), list) and all(_is_number(x) for x in s[k])):
                bad(f"{field}[{i}].{k}", s.get(k), "a list of finite numbers (per block)")
        if len(s["err2"]) != len(s["floor2"]):
            bad(f"{field}[{i}].floor2", s["floor2"], f"{len(s['err2'])} blocks, as err2 has")
        sizes.add(len(s["err2"]))
    if len(sizes) > 1:
        bad(field, sorted(sizes), "the same number of blocks on every seed")
