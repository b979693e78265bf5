"""`parity mutants`: run the catalogue (parity.mutants) beside the unmutated kernels
and FLA through the gate, and score which cases and checks caught each mutant."""

from __future__ import annotations

import sys
from pathlib import Path

from cases import Case
from parity.cli import args as check
from parity.cli.common import (
    UsageError,
    select_cases,
    selection_options,
    tpu_options,
    tpu_targets,
    write_report,
)
from parity.execute.runner import RunConfig, run_cases
from parity.judge.gate import evaluate, load, load_compiles
from parity.measure.compare import describe_localisation
from parity.model.spec import MUTANT_PREFIX, REFERENCE
from parity.mutants import BY_NAME, CATALOGUE, Mutant, catalogue_json
from parity.records import write_json


def add_parser(sub) -> None:
    sp = sub.add_parser("mutants", help="run the catalogue of mutant kernels and score what the harness catches")
    selection_options(sp, single=True)
    sp.add_argument(
        "--out", type=check.output_dir, default="reports/mutants", help="output directory (default reports/mutants)"
    )
    sp.add_argument("--only", action="append", help="run only this mutant (repeatable)")
    sp.add_argument("--list", action="store_true", help="print the catalogue as JSON and exit")
    sp.add_argument("-j", "--jobs", type=check.positive_int, default=1, help="parallel worker processes")
    sp.add_argument("--timeout", type=check.seconds, default=900.0, help="seconds per backend call before it is killed")
    sp.add_argument("--bound-factor", type=check.bound_factor, default=1.0)
    sp.add_argument("--no-html", action="store_true", help="do not write index.html")
    sp.add_argument("--no-progress", action="store_true")
    tpu_options(sp)
    sp.set_defaults(fn=cmd_mutants)


def cmd_mutants(a) -> int:
    if a.list:
        print(catalogue_json())
        return 0
    for n in a.only or []:
        if n not in BY_NAME:
            raise UsageError(f"--only {n!r}: expected one of {sorted(BY_NAME)}")
    if not (a.suite or a.cases or a.case):
        a.suite = "ci"
    cases = select_cases(a)
    if not cases:
        raise UsageError("no cases selected")
    out = Path(a.out)
    print(f"parity mutants: {len(cases)} cases -> {out}", file=sys.stderr)
    result = run_mutants(
        cases,
        out,
        jobs=a.jobs,
        timeout_s=a.timeout,
        factor=a.bound_factor,
        names=a.only,
        progress=not a.no_progress,
        tpu_targets=tpu_targets(a),
    )
    print(format_score(result))
    if not a.no_html:
        page = write_report([out], out / "index.html")
        if page:
            print(f"report: {page.resolve()}")
    return 0 if result["caught"] == result["total"] and not result["unmutated_failures"] else 1


def score(gate: dict, mutants: list[Mutant]) -> dict:
    """Per mutant: the cases and checks that caught it; the unmutated kernels' failures."""
    rows = []
    for m in mutants:
        caught, ran = [], 0
        for entry in gate["cases"]:
            if entry["candidate"] != f"mutant-{m.name}" or entry["verdict"] == "unsupported":
                continue
            ran += 1
            if entry["verdict"] != "pass":
                checks = sorted(
                    {t["verdict"] for t in entry["tensors"].values() if t["verdict"] not in ("pass", "unsupported")}
                    or {entry["verdict"]}
                )
                tensors = sorted(n for n, t in entry["tensors"].items() if t["verdict"] not in ("pass", "unsupported"))
                where = {n: describe_localisation(entry["tensors"][n].get("localisation")) for n in tensors}
                caught.append(
                    {
                        "case_id": entry["case_id"],
                        "checks": checks,
                        "tensors": tensors,
                        "where": {n: w for n, w in where.items() if w},
                    }
                )
        rows.append(
            {
                "mutant": m.name,
                "seed": m.seed,
                "what": m.what,
                "cases_run": ran,
                "caught": bool(caught),
                "caught_by": caught,
            }
        )
    clean = [f for f in gate["failures"] if not f["candidate"].startswith("mutant-")]
    n_caught = sum(r["caught"] for r in rows)
    return {
        "mutants": rows,
        "caught": n_caught,
        "total": len(rows),
        "score": n_caught / len(rows) if rows else None,
        "unmutated_failures": clean,
    }


def format_score(result: dict) -> str:
    lines = [f"{'mutant':30s} {'seed':5s} {'cases':>5s}  caught by"]
    for r in result["mutants"]:
        if r["caught"]:
            checks = sorted({c for cb in r["caught_by"] for c in cb["checks"]})
            first = r["caught_by"][0]
            by = (
                f"{len(r['caught_by'])} case(s) [{', '.join(checks)}], e.g. {first['case_id']} "
                f"({', '.join(first['tensors']) or first['checks'][0]})"
            )
            if first.get("where"):
                name, where = next(iter(first["where"].items()))
                by += f"\n{'':43s}at {name}: {where}"
        else:
            by = "NOT CAUGHT" + ("" if r["cases_run"] else " (no case of its op ran)")
        lines.append(f"{r['mutant']:30s} {r['seed'] or '-':5s} {r['cases_run']:5d}  {by}")
    lines.append(
        f"score: {result['caught']}/{result['total']} mutants caught"
        + (f" ({100 * result['score']:.0f}%)" if result["score"] is not None else "")
    )
    clean = result["unmutated_failures"]
    lines.append(
        "unmutated kernels: clean"
        if not clean
        else f"unmutated kernels: {len(clean)} failures, e.g. {clean[0]['case_id']} [{clean[0]['candidate']}] "
        f"{clean[0]['tensor'] or ''} {clean[0]['verdict']}"
    )
    return "\n".join(lines)


def run_mutants(
    cases: list[Case],
    out: Path,
    jobs: int = 1,
    timeout_s: float = 900.0,
    factor: float = 1.0,
    names: list[str] | None = None,
    progress: bool = True,
    tpu_targets: tuple[str, ...] = (),
) -> dict:
    """Run the unmutated kernels, FLA and every mutant over `cases` (compiling the kernels
    for `tpu_targets`); gate and score them."""
    mutants = [BY_NAME[n] for n in names] if names else [m for m in CATALOGUE if not m.narrow]
    specs = ["oracle", REFERENCE, "pallas", "pallas-fused"] + [f"{MUTANT_PREFIX}{m.name}" for m in mutants]
    run_cases(
        cases,
        RunConfig(
            out_dir=out, backends=specs, jobs=jobs, timeout_s=timeout_s, progress=progress, tpu_targets=tpu_targets
        ),
    )
    gate = evaluate(load([out]), factor, compiles=load_compiles([out]))
    result = score(gate, mutants)
    write_json(out / "mutants.json", {**result, "bound_factor": factor, "cases": [c.id for c in cases]})
    write_json(out / "gate.json", gate)
    return result
