"""`parity mutants`: run the catalogue (parity.mutants.catalogue) beside the unmutated kernels
and FLA through the gate, and score which cases and checks caught each mutant."""

from __future__ import annotations

from pathlib import Path

from cases import Case

from ..compare import describe_localisation
from ..gate import evaluate, load, load_compiles
from ..records import write_json
from ..runner import RunConfig, run_cases
from ..spec import MUTANT_PREFIX, REFERENCE
from .catalogue import BY_NAME, CATALOGUE, Mutant


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
