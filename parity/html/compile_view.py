"""The TPU compile records (kind "compile": a candidate compiled for TPU targets on a CPU host,
nothing executed) as the page shows them: the index's compile section (`compile_section`), the case
table's compile column (`compile_cell`) and the detail view's compile section (`compile_detail`)."""

from __future__ import annotations

from parity.judge.compiles import CompileFigures, compile_figures
from parity.model.verdict import Verdict

COMPILE_LABEL = "compiled for TPU on a CPU host (deviceless AOT compile; nothing executed)"
TARGET_ORDER = ("v4", "v5e", "v5p", "v6e", "tpu7x")


def worst_page_verdict(verdicts) -> str:
    """worst_verdict over the page's verdicts (compile verdicts included; unknown ones count as error)."""
    rank = {v: i for i, v in enumerate(Verdict)}
    return min(verdicts, key=lambda v: rank.get(v, 0), default=Verdict.PASS)


def _targets(rec: dict) -> dict[str, dict]:
    return {t: e for t, e in (rec.get("targets") or {}).items() if isinstance(e, dict)}


def _error_line(entry: dict) -> str:
    line = entry.get("error_line") or next(
        (ln.strip() for ln in str(entry.get("error") or "").splitlines() if ln.strip()), ""
    )
    return line[:300] or "failed (no error message)"


def _mismatches(entry: dict) -> list:
    return list((entry.get("numerics") or {}).get("mismatches") or [])


def compile_target_order(compile_by_case: dict) -> list[str]:
    names = {t for recs in compile_by_case.values() for r in recs.values() for t in _targets(r)}
    return [t for t in TARGET_ORDER if t in names] + sorted(names - set(TARGET_ORDER))


def _bytes(n) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    return f"{n} B" if n < 1024 else (f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB")


def compile_cell(rec: dict | None) -> dict | None:
    """The case table's compile column: worst verdict over candidates and the failing (candidate, target)s."""
    if not rec:
        return None
    failing = [f"{b}: {t}" for b, r in rec.items() for t, e in _targets(r).items() if not e.get("ok")]
    errors = [
        f"{b} on {t}: {_error_line(e)}" for b, r in rec.items() for t, e in _targets(r).items() if not e.get("ok")
    ]
    mism = [
        f"{b}: {t} numerics" for b, r in rec.items() for t, e in _targets(r).items() if e.get("ok") and _mismatches(e)
    ]
    cell = {
        "v": worst_page_verdict(r["verdict"] for r in rec.values()),
        "f": "; ".join(failing + mism) or None,
        "err": "\n".join(errors)[:600] or None,
        "ok": sum(1 for r in rec.values() for e in _targets(r).values() if e.get("ok")),
        "n": sum(len(_targets(r)) for r in rec.values()),
    }
    return {k: v for k, v in cell.items() if v is not None}


def _matrix_row(rec: dict, index: dict[str, int]) -> dict:
    """One (case, candidate) row of the compile matrix: a cell per target (ok, seconds, error line,
    numerics mismatches)."""
    cells = {}
    for t, e in _targets(rec).items():
        ok, s = bool(e.get("ok")), e.get("seconds")
        cells[t] = {
            "ok": ok,
            "s": f"{s:.2f}" if isinstance(s, (int, float)) else "?",
            "err": None if ok else _error_line(e),
            "mm": len(_mismatches(e)) if ok else 0,
        }
    return {
        "n": index.get(rec["case_id"]),
        "id": rec["case_id"],
        "backend": rec["backend"],
        "verdict": rec["verdict"],
        "program": rec.get("program", ""),
        "cells": cells,
    }


def _seconds(f: CompileFigures) -> dict | None:
    """Compile time per (case, candidate, target): the judge's median, the slowest and where."""
    if not f.slowest:
        return None
    s, case_id, backend, target = f.slowest
    return {"n": len(f.seconds), "median": f.median_seconds, "max": s, "max_at": f"{case_id} / {backend} / {target}"}


def compile_section(
    compile_by_case: dict, index: dict[str, int], targets: list[str], gate_section: dict | None
) -> dict | None:
    """The index page's TPU compile section: the matrix (failures first), counts per target, compile
    seconds, the largest VMEM use (the judge's figures, parity.judge.compiles), the versions and
    where it ran; None without compile records."""
    f = compile_figures(compile_by_case)
    if f is None:
        return None
    recs = [r for cid in sorted(compile_by_case) for _, r in sorted(compile_by_case[cid].items())]
    rank = {v: i for i, v in enumerate(Verdict)}
    matrix = sorted((_matrix_row(r, index) for r in recs), key=lambda m: rank.get(m["verdict"], 0))  # failures first
    counts = {t: f.by_target.get(t, {}) for t in targets}
    failures = [
        f"{c['failed']} of {c['pairs']} (case, candidate) pairs fail on {t}"
        for t, c in counts.items()
        if c.get("failed")
    ]
    mismatches = [
        f"{c['mismatch']} of {c['pairs']} (case, candidate) pairs compiled on {t} use other matmul classes "
        "than the numerics model"
        for t, c in counts.items()
        if c.get("mismatch")
    ]
    vmem = f.largest_vmem and {**f.largest_vmem, "text": _bytes(f.largest_vmem["bytes"])}
    versions = lambda key: sorted({str(r.get(key)) for r in recs if r.get(key)})  # noqa: E731
    return {
        "label": COMPILE_LABEL,
        "targets": targets,
        "pairs": f.pairs,
        "rows": matrix,
        "failed_pairs": f.failed_pairs,
        "by_target": [
            {"target": t, **{k: c.get(k, 0) for k in ("pairs", "ok", "failed", "mismatch")}} for t, c in counts.items()
        ],
        "failures": failures,
        "mismatches": mismatches,
        "numerics_errors": f.numerics_errors,
        "seconds": _seconds(f),
        "vmem": vmem,
        "libtpu": versions("libtpu"),
        "jax": versions("jax"),
        "numerics": versions("numerics"),
        "programs": versions("program"),
        "hosts": versions("host"),
        "gate": gate_section,
        "status": "fail" if failures else ("mismatch" if mismatches else "pass"),
    }


def compile_detail(rec: dict, targets: list[str]) -> dict:
    """One candidate's compile record for the detail view: its fields and its targets in page order."""
    keep = {
        k: rec.get(k)
        for k in (
            "backend",
            "implementation",
            "program",
            "libtpu",
            "jax",
            "numerics",
            "created",
            "host",
            "repro",
            "run_id",
        )
    }
    entries = _targets(rec)
    order = [t for t in targets if t in entries] + sorted(set(entries) - set(targets))
    return {**keep, "verdict": rec["verdict"], "targets": [{"target": t, **entries[t]} for t in order]}
