"""Records -> report data -> files. `build_report` is pure data (tested without a browser);
`write_report` renders the jinja2 template and writes the page, its assets and one detail
file per case; `write_diff_page` writes the `parity diff` page. The data comes from
parity.html.rows (table rows, details, summary) and parity.html.compile_view (TPU compiles)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from importlib import resources
from pathlib import Path

import jinja2
from markupsafe import Markup

from cases import CaseError
from parity.html.compile_view import compile_section, compile_target_order
from parity.html.rows import (
    backend_order,
    bound_points,
    case_detail,
    case_row,
    gate_per_case,
    stage_localisations,
    summary,
)
from parity.judge.diff import ratio_summary
from parity.model.verdict import Verdict
from parity.records import load_latest, read_json

PLOTLY_JS = "plotly.min.js"
STATIC_FILES = ("report.js", "report.css")


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


def _gate_allowances(dirs: list[Path]) -> dict[str, bool]:
    """The allow_inconclusive and allow_unbounded_reference of an existing gate.json (what `parity
    run` or `parity gate` was given), each False unless it says true."""
    for d in dirs:
        p = Path(d) / "gate.json"
        if p.is_file():
            try:
                g = read_json(p)
            except (OSError, ValueError):
                continue
            if isinstance(g, dict):
                return {k: g.get(k) is True for k in ("allow_inconclusive", "allow_unbounded_reference")}
    return {}


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


def build_report(dirs: list[Path]) -> dict:
    """{'summary', 'backends', 'rows', 'details', 'bound' (the scatter's points), ...} from the result
    and compile records under `dirs` (a case with compile records only gets a row too)."""
    dirs = [Path(d) for d in dirs]
    by_case, compiles = load_latest(dirs), load_latest(dirs, kind="compile")
    backends = backend_order(by_case)
    targets = compile_target_order(compiles)
    factor = _bound_factor(dirs)
    gate_cases, gate = gate_per_case(by_case, factor, compiles, **_gate_allowances(dirs))
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
    for d in details:
        try:
            d["stages"] = stage_localisations(d["id"], by_case, factor)
        except (CaseError, KeyError, ValueError) as e:  # the page says so; the run's verdict stands
            d["stages"], d["stages_error"] = [], f"stage localisation not built: {e}"
    s = summary(rows, by_case, backends, gate, dirs, [])
    s["compile"] = compile_section(compiles, {r["id"]: r["n"] for r in rows}, targets, _gate_compile(dirs))
    s["compile_records"] = sum(len(v) for v in compiles.values())
    return {
        "summary": s,
        "backends": backends,
        "sides": {b: next(r[b]["side"] for r in by_case.values() if b in r) for b in backends},
        "verdict_order": list(Verdict),
        "compile_targets": targets,
        "bound": bound_points(gate_cases, rows, factor),
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
    page_data = {k: report[k] for k in ("backends", "sides", "verdict_order", "compile_targets", "bound", "rows")}
    page_data["assets"] = assets.name
    # a `parity fuzz` page beside the results (OUT/fuzz.html): linked from the header
    fuzz_pages = [os.path.relpath(Path(d) / "fuzz.html", out.parent) for d in dirs if (Path(d) / "fuzz.html").exists()]
    html = (
        _env()
        .get_template("index.html.j2")
        .render(
            s=report["summary"],
            bound=report["bound"],
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
    """The `parity diff` result (parity.judge.diff.diff_runs) as one self-contained page."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    html = (
        _env()
        .get_template("diff.html.j2")
        .render(d=result, ratios=ratio_summary(result["rows"]), generated=time.strftime("%Y-%m-%d %H:%M:%S%z"))
    )
    tmp = out.with_name(f".tmp-{out.name}")
    tmp.write_text(html)
    tmp.replace(out)
    return out
