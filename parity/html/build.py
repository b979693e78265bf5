"""Records -> report data -> files. `build_report` is pure data (tested without a browser);
`write_report` renders the jinja2 template and writes the page, its assets and one detail
file per case."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import sys
import time
from collections import Counter, defaultdict
from importlib import resources
from pathlib import Path

import jinja2
from markupsafe import Markup

from ..compare import describe_localisation
from ..gate import GateRefusal, evaluate
from ..records import VERDICT_ORDER, load_latest, read_json
from ..spec import REFERENCE

TENSOR_ORDER = ("o", "ht", "dq", "dk", "dv", "dg", "dg_gamma", "dbeta", "dh0")
PLOTLY_JS = "plotly.min.js"
STATIC_FILES = ("report.js", "report.css")
COMPILE_LABEL = "compiled for TPU on a CPU host (deviceless AOT compile; nothing executed)"
TARGET_ORDER = ("v4", "v5e", "v5p", "v6e", "tpu7x")


# ------------------------------------------------------------------ loading
def _bound_factor(dirs: list[Path]) -> float:
    """The factor of an existing gate.json (what `parity run --bound-factor` used), else 1.0."""
    for d in dirs:
        p = Path(d) / "gate.json"
        if p.is_file():
            try:
                return float(read_json(p).get("bound_factor", 1.0))
            except (OSError, ValueError, TypeError):
                pass
    return 1.0


def _gate_compile(dirs: list[Path]) -> dict | None:
    """The "compile" section of an existing gate.json, if it has one."""
    for d in dirs:
        p = Path(d) / "gate.json"
        if p.is_file():
            try:
                section = read_json(p).get("compile")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(section, dict):
                return section
    return None


def gate_per_case(by_case: dict, factor: float, compiles: dict | None = None) -> tuple[dict[str, dict], dict]:
    """The gate (parity.gate.evaluate) case by case, so that one refused case does not hide
    the others: case_id -> {candidate: entry} or {'refused': reason}; and the overall outcome.
    TPU compile records join as they do in `parity gate` (compile-error, numerics-mismatch);
    without both sides' results only the compile records are judged."""
    compiles = compiles or {}
    per_case: dict[str, dict] = {}
    has_ref = any(r["side"] == "reference" for recs in by_case.values() for r in recs.values())
    has_cand = any(r["side"] == "candidate" for recs in by_case.values() for r in recs.values())
    note = None
    if not (has_ref and has_cand):
        missing = f"reference ({REFERENCE})" if not has_ref else "candidate"
        if not compiles:
            return per_case, {"status": "not evaluated", "reason": f"no {missing} results in these directories"}
        note = f"TPU compile records only: no {missing} results in these directories, so no accuracy or bound checks"
    failures, refused, counts = 0, [], Counter()
    for cid in sorted(set(by_case) | set(compiles)):
        recs = by_case.get(cid, {}) if note is None else {}
        try:
            g = evaluate(
                {cid: recs} if recs else {},
                factor,
                REFERENCE,
                compiles={cid: compiles[cid]} if cid in compiles else None,
            )
        except GateRefusal as e:
            per_case[cid] = {"refused": str(e)}
            refused.append(str(e))
            continue
        per_case[cid] = {c["candidate"]: c for c in g["cases"]}
        failures += len(g["failures"])
        counts.update(c["verdict"] for c in g["cases"])
    status = "refused" if refused else ("pass" if failures == 0 else "fail")
    return per_case, {
        "status": status,
        "factor": factor,
        "failures": failures,
        "refused": len(refused),
        "refusal_examples": refused[:3],
        "counts": _ordered_counts(counts),
        "note": note,
    }


# ------------------------------------------------------------------ TPU compile records
def _worst(verdicts) -> str:
    """worst_verdict over the page's verdicts (compile verdicts included; unknown ones count as error)."""
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
    return min(verdicts, key=lambda v: rank.get(v, 0), default="pass")


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
        "v": _worst(r["verdict"] for r in rec.values()),
        "f": "; ".join(failing + mism) or None,
        "err": "\n".join(errors)[:600] or None,
        "ok": sum(1 for r in rec.values() for e in _targets(r).values() if e.get("ok")),
        "n": sum(len(_targets(r)) for r in rec.values()),
    }
    return {k: v for k, v in cell.items() if v is not None}


def compile_summary(
    compile_by_case: dict, index: dict[str, int], targets: list[str], gate_section: dict | None
) -> dict | None:
    """The index page's TPU compile section: the matrix (failures first), counts per target, compile
    seconds, the largest VMEM use, the versions and where it ran; None without compile records."""
    if not compile_by_case:
        return None
    matrix, seconds, vmem = [], [], None
    by_target = {t: Counter() for t in targets}
    recs = [r for cid in sorted(compile_by_case) for _, r in sorted(compile_by_case[cid].items())]
    for r in recs:
        cells = {}
        for t, e in _targets(r).items():
            ok = bool(e.get("ok"))
            by_target[t]["pairs"] += 1
            by_target[t]["ok" if ok else "failed"] += 1
            if ok and _mismatches(e):
                by_target[t]["mismatch"] += 1
            s = e.get("seconds")
            if isinstance(s, (int, float)):
                seconds.append((s, r["case_id"], r["backend"], t))
            for kernel, info in (e.get("mosaic") or {}).items():
                b = (info or {}).get("vmem_bytes")
                if isinstance(b, (int, float)) and (vmem is None or b > vmem["bytes"]):
                    vmem = {
                        "bytes": b,
                        "text": _bytes(b),
                        "kernel": kernel,
                        "case": r["case_id"],
                        "backend": r["backend"],
                        "target": t,
                    }
            cells[t] = {
                "ok": ok,
                "s": f"{s:.2f}" if isinstance(s, (int, float)) else "?",
                "err": None if ok else _error_line(e),
                "mm": len(_mismatches(e)) if ok else 0,
            }
        matrix.append(
            {
                "n": index.get(r["case_id"]),
                "id": r["case_id"],
                "backend": r["backend"],
                "verdict": r["verdict"],
                "program": r.get("program", ""),
                "cells": cells,
            }
        )
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
    matrix.sort(key=lambda m: rank.get(m["verdict"], 0))  # stable: failures first, then by case id
    pairs = len(recs)
    failures = [
        f"{c['failed']} of {c['pairs']} (case, candidate) pairs fail on {t}"
        for t, c in by_target.items()
        if c["failed"]
    ]
    mismatches = [
        f"{c['mismatch']} of {c['pairs']} (case, candidate) pairs compiled on {t} use other matmul classes "
        "than the numerics model"
        for t, c in by_target.items()
        if c["mismatch"]
    ]
    secs = sorted(x[0] for x in seconds)
    slowest = max(seconds) if seconds else None
    versions = lambda key: sorted({str(r.get(key)) for r in recs if r.get(key)})  # noqa: E731
    return {
        "label": COMPILE_LABEL,
        "targets": targets,
        "pairs": pairs,
        "rows": matrix,
        "failed_pairs": sum(1 for r in recs if any(not e.get("ok") for e in _targets(r).values())),
        "by_target": [
            {"target": t, **{k: c.get(k, 0) for k in ("pairs", "ok", "failed", "mismatch")}}
            for t, c in by_target.items()
        ],
        "failures": failures,
        "mismatches": mismatches,
        "numerics_errors": sum(1 for r in recs for e in _targets(r).values() if (e.get("numerics") or {}).get("error")),
        "seconds": {
            "n": len(secs),
            "median": statistics.median(secs),
            "max": slowest[0],
            "max_at": f"{slowest[1]} / {slowest[2]} / {slowest[3]}",
        }
        if secs
        else None,
        "vmem": vmem,
        "libtpu": versions("libtpu"),
        "jax": versions("jax"),
        "numerics": versions("numerics"),
        "programs": versions("program"),
        "hosts": versions("host"),
        "gate": gate_section,
        "status": "fail" if failures else ("mismatch" if mismatches else "pass"),
    }


# ------------------------------------------------------------------ rows and summary
def _worst_tensor(tensors: dict) -> tuple[str | None, dict]:
    """The tensor with NaN/Inf, else the highest rel_rms / tol (as parity.runner's summary line)."""
    worst, score = None, -1.0
    for name, t in tensors.items():
        if t.get("nan") or t.get("inf"):
            return name, t
        eps, tolerance = t.get("rel_rms"), t.get("tol")
        if eps is None or not tolerance:
            continue
        if eps / tolerance > score:
            worst, score = name, eps / tolerance
    return worst, tensors.get(worst, {}) if worst else {}


def _bound_use(gate_entry: dict | None) -> float | None:
    """max over tensors and metrics of eps_candidate / (factor * eps_reference + floor): > 1 fails."""
    if not gate_entry:
        return None
    uses = []
    for t in gate_entry.get("tensors", {}).values():
        for metric in ("rel_rms", "max_abs"):
            m = (t.get("bound") or {}).get(metric) or {}
            c, limit = m.get("candidate"), m.get("limit")
            if c is None or limit is None:
                continue
            uses.append(c / limit if limit > 0 else (0.0 if c == 0 else math.inf))
    finite = [u for u in uses if math.isfinite(u)]
    return max(finite) if finite else None


def _gating(case: dict) -> str:
    params = case.get("gate_params") or {}
    return str(case.get("gate", "")) + (
        "(" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + ")" if params else ""
    )


def backend_order(by_case: dict) -> list[str]:
    """oracle, the reference, then candidates by name."""
    sides = {}
    for recs in by_case.values():
        for name, r in recs.items():
            sides.setdefault(name, r.get("side", "candidate"))
    rank = {"oracle": 0, "reference": 1, "candidate": 2}
    return sorted(sides, key=lambda b: (rank.get(sides[b], 3), b))


def _where(gate_entry: dict | None, worst: str | None) -> str | None:
    """Localisation of a failing candidate: of its worst tensor if that fails, else of the first failing one."""
    tensors = (gate_entry or {}).get("tensors", {})
    failing = [n for n, t in tensors.items() if t.get("localisation")]
    if not failing:
        return None
    name = worst if worst in failing else failing[0]
    return f"{name}: {describe_localisation(tensors[name]['localisation'])}"


def _case_dict(recs: dict, compile_recs: dict | None) -> dict:
    any_rec = next(iter(recs.values()), None) or next(iter((compile_recs or {}).values()), None) or {}
    return any_rec.get("case") or {}


def headline_verdict(cells: dict[str, dict], recs: dict[str, dict], cc: dict | None) -> str:
    """A case's verdict: the worst of the candidates that apply to it (and its TPU compiles);
    a candidate with no kernel for it (unsupported) is not applicable and never outranks a pass;
    "unsupported" when none applies. A case without candidate records: the worst of the oracle's
    and the reference's."""
    candidates = [b for b in cells if recs[b].get("side") == "candidate"]
    judged = [cells[b]["v"] for b in (candidates or cells)]
    applicable = [v for v in judged if v != "unsupported"] + ([cc["v"]] if cc else [])
    return _worst(applicable) if applicable else "unsupported"


def case_row(
    index: int, case_id: str, recs: dict, gate_case: dict, backends: list[str], compile_recs: dict | None = None
) -> dict:
    """One table row: the case's fields and, per backend, verdict, worst tensor, rel_rms, max_abs, bound use;
    with compile records, the compile column ("cc"), whose verdict counts in the row's."""
    case = _case_dict(recs, compile_recs)
    cells = {}
    for b in backends:
        r = recs.get(b)
        if r is None:
            continue
        entry = gate_case.get(b) if isinstance(gate_case, dict) else None
        verdict = entry["verdict"] if entry and "verdict" in entry else r.get("verdict") or r.get("status") or "error"
        name, t = _worst_tensor(r.get("tensors", {})) if r.get("side") != "oracle" else (None, {})
        nonfinite = any(x.get("nan") or x.get("inf") for x in r.get("tensors", {}).values())
        cell = {
            "v": verdict,
            "t": name,
            "e": t.get("rel_rms"),
            "m": t.get("max_abs"),
            "r": None if nonfinite else _bound_use(entry),  # finite-only epsilons bound nothing
            "nan": bool(t.get("nan") or t.get("inf")),
            "err": (r.get("error") or "").strip().splitlines()[0][:300] if (r.get("error") or "").strip() else None,
            "l": _where(entry, name),
        }
        cells[b] = {k: v for k, v in cell.items() if v is not None and v is not False}  # page size: drop empties
    cc = compile_cell(compile_recs)
    row = {
        "n": index,
        "id": case_id,
        "op": case.get("op"),
        "dtype": case.get("dtype"),
        "C": case.get("chunk_size"),
        "gating": _gating(case),
        "verdict": headline_verdict(cells, recs, cc),
        "b": cells,
    }
    if cc:
        row["cc"] = cc
    if isinstance(gate_case, dict) and gate_case.get("refused"):
        row["refused"] = gate_case["refused"]
    return row


def _ordered_counts(counter: Counter) -> dict:
    known = [v for v in VERDICT_ORDER if v in counter]
    return {v: counter[v] for v in known + sorted(set(counter) - set(known))}


def summary(
    rows: list[dict], by_case: dict, backends: list[str], gate: dict, dirs: list[Path], skipped: list[str]
) -> dict:
    """Counts by verdict and by op, dtype, chunk size, gating; where each backend ran and with what."""
    verdicts = _ordered_counts(Counter(r["verdict"] for r in rows))
    columns = list(verdicts)
    breakdown = {}
    for label, key in (("op", "op"), ("dtype", "dtype"), ("chunk size", "C"), ("gating", "gating")):
        table = defaultdict(Counter)
        for r in rows:
            table[str(r[key])][r["verdict"]] += 1
        breakdown[label] = [
            {"value": v, "total": sum(c.values()), "counts": [c.get(col, 0) for col in columns]}
            for v, c in sorted(table.items())
        ]
    where = []
    for b in backends:
        recs = [recs[b] for recs in by_case.values() if b in recs]
        platforms = Counter(r.get("platform") or "(none)" for r in recs)
        versions = Counter(
            ", ".join(f"{k} {v}" for k, v in sorted((r.get("versions") or {}).items())) or "(none)" for r in recs
        )
        where.append(
            {
                "backend": b,
                "side": recs[0].get("side", ""),
                "records": len(recs),
                "verdicts": _ordered_counts(Counter(r.get("verdict", "") for r in recs)),
                "platforms": platforms.most_common(),
                "versions": versions.most_common(3),
                "hosts": sorted({r.get("host", "") for r in recs}),
                "implementations": sorted({r.get("implementation") or "" for r in recs} - {""}),
            }
        )
    created = sorted(r.get("created", "") for recs in by_case.values() for r in recs.values())
    return {
        "cases": len(rows),
        "records": sum(len(v) for v in by_case.values()),
        "verdicts": verdicts,
        "columns": columns,
        "breakdown": breakdown,
        "where": where,
        "gate": gate,
        "dirs": [str(d) for d in dirs],
        "skipped": skipped[:20],
        "n_skipped": len(skipped),
        "created": (created[0], created[-1]) if created else None,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S%z"),
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


def case_detail(
    row: dict,
    recs: dict,
    gate_case: dict,
    backends: list[str],
    compile_recs: dict | None = None,
    compile_targets: list[str] = (),
) -> dict:
    """Everything the detail view shows for one case (the per-case file's payload)."""
    out_backends = []
    for b in backends:
        r = recs.get(b)
        if r is None:
            continue
        keep = {
            k: r.get(k)
            for k in (
                "side",
                "status",
                "verdict",
                "platform",
                "implementation",
                "versions",
                "kernel_time_s",
                "wall_time_s",
                "error",
                "notes",
                "repro",
                "run_id",
                "host",
                "created",
                "input_hash",
                "oracle_version",
                "tol_version",
            )
        }
        out_backends.append(
            {
                "name": b,
                "row_verdict": row["b"][b]["v"],
                **keep,
                "tensors": r.get("tensors", {}),
                "gate": gate_case.get(b) if isinstance(gate_case, dict) else None,
            }
        )
    names = {n for r in recs.values() for n in r.get("tensors", {})}
    order = [n for n in TENSOR_ORDER if n in names] + sorted(names - set(TENSOR_ORDER))
    compiled = [compile_detail(r, list(compile_targets)) for _, r in sorted((compile_recs or {}).items())]
    return {
        "n": row["n"],
        "id": row["id"],
        "verdict": row["verdict"],
        "case": _case_dict(recs, compile_recs),
        "refused": row.get("refused"),
        "tensor_order": order,
        "backends": out_backends,
        "compile": compiled,
        "compile_label": COMPILE_LABEL if compiled else None,
    }


def build_report(dirs: list[Path]) -> dict:
    """{'summary', 'backends', 'rows', 'details', ...} from the result and compile records under `dirs`
    (a case with compile records only gets a row too)."""
    dirs = [Path(d) for d in dirs]
    by_case, compiles = load_latest(dirs), load_latest(dirs, kind="compile")
    backends = backend_order(by_case)
    targets = compile_target_order(compiles)
    gate_cases, gate = gate_per_case(by_case, _bound_factor(dirs), compiles)
    ids = sorted(set(by_case) | set(compiles))
    rows = [
        case_row(i, cid, by_case.get(cid, {}), gate_cases.get(cid, {}), backends, compiles.get(cid))
        for i, cid in enumerate(ids)
    ]
    details = [
        case_detail(
            row, by_case.get(row["id"], {}), gate_cases.get(row["id"], {}), backends, compiles.get(row["id"]), targets
        )
        for row in rows
    ]
    s = summary(rows, by_case, backends, gate, dirs, [])
    s["compile"] = compile_summary(compiles, {r["id"]: r["n"] for r in rows}, targets, _gate_compile(dirs))
    s["compile_records"] = sum(len(v) for v in compiles.values())
    return {
        "summary": s,
        "backends": backends,
        "sides": {b: next(r[b]["side"] for r in by_case.values() if b in r) for b in backends},
        "verdict_order": list(VERDICT_ORDER),
        "compile_targets": targets,
        "rows": rows,
        "details": details,
    }


# ------------------------------------------------------------------ writing
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("parity.html", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.policies["json.dumps_kwargs"] = {"sort_keys": False, "allow_nan": False, "separators": (",", ":")}
    env.filters["vlabel"] = lambda v: "not applicable" if v == "unsupported" else v  # no kernel for the case
    env.filters["fmt"] = lambda x: "-" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))
    return env


def _safe_json(obj) -> str:
    """JSON for a <script>: '<', '>', '&' and the JS line separators escaped, so no string can
    close the element or start markup; NaN refused (records never hold it)."""
    text = json.dumps(obj, allow_nan=False, separators=(",", ":"), default=str)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _plotly_js() -> Path | None:
    """plotly.min.js as shipped in the plotly Python package, or None without the package."""
    try:
        path = Path(str(resources.files("plotly") / "package_data" / PLOTLY_JS))
    except ModuleNotFoundError:
        return None
    return path if path.is_file() else None


def _copy_if_changed(src: Path, dst: Path) -> None:
    if not (dst.is_file() and dst.stat().st_size == src.stat().st_size and dst.stat().st_mtime >= src.stat().st_mtime):
        shutil.copyfile(src, dst)


def write_report(dirs: list[Path], out: Path) -> Path:
    """Write `out` (an .html file) and `<out stem>_files/` beside it; returns `out`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    assets = out.parent / f"{out.stem}_files"
    cases_dir = assets / "cases"
    cases_dir.mkdir(parents=True, exist_ok=True)
    for stale in cases_dir.iterdir():  # detail files of an earlier report written here
        if re.fullmatch(r"\d+\.js", stale.name):
            stale.unlink()
    report = build_report(dirs)
    static = resources.files("parity.html") / "static"
    for name in STATIC_FILES:
        (assets / name).write_bytes((static / name).read_bytes())
    plotly_js = _plotly_js()
    if plotly_js is None:
        print(
            "parity report: the plotly package is missing: the page will have no plots (pip install plotly)",
            file=sys.stderr,
        )
    else:
        _copy_if_changed(plotly_js, assets / PLOTLY_JS)
    for d in report["details"]:
        (cases_dir / f"{d['n']}.js").write_text(f"parityCaseLoaded({d['n']},{_safe_json(d)});\n")
    page_data = {k: report[k] for k in ("backends", "sides", "verdict_order", "compile_targets", "rows")}
    page_data["assets"] = assets.name
    # a `parity fuzz` page beside the results (OUT/fuzz.html): linked from the header
    fuzz_pages = [os.path.relpath(Path(d) / "fuzz.html", out.parent) for d in dirs if (Path(d) / "fuzz.html").exists()]
    html = (
        _env()
        .get_template("index.html.j2")
        .render(
            s=report["summary"],
            backends=report["backends"],
            assets=assets.name,
            fuzz_pages=fuzz_pages,
            data_json=Markup(_safe_json(page_data)),
        )
    )
    tmp = out.with_name(f".tmp-{out.name}")
    tmp.write_text(html)
    tmp.replace(out)
    return out


def write_diff_page(result: dict, out: Path) -> Path:
    """The `parity diff` result (parity.diff.diff_runs) as one self-contained page."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    finite = sorted(r["ratio"] for r in result["rows"] if r["ratio"] is not None and math.isfinite(r["ratio"]))
    ratios = {"median": statistics.median(finite), "max": finite[-1]} if finite else None
    html = (
        _env()
        .get_template("diff.html.j2")
        .render(d=result, ratios=ratios, generated=time.strftime("%Y-%m-%d %H:%M:%S%z"))
    )
    tmp = out.with_name(f".tmp-{out.name}")
    tmp.write_text(html)
    tmp.replace(out)
    return out
