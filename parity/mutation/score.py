"""The score of a `parity mutants` run: per mutant, the cases and checks that caught it (score,
from the run's gate and its MutantSchedule), and the terminal table of it (format_score)."""

from __future__ import annotations

from parity.judge.words import describe_localisation
from parity.model.verdict import Verdict
from parity.mutants import Mutant
from parity.mutation.judgement import NOT_A_CATCH, catches
from parity.mutation.schedule import MutantSchedule


def score(gate: dict, mutants: list[Mutant], schedule: MutantSchedule | None = None) -> dict:
    """Per mutant: the cases and checks that caught it, the cases it ran (supported ones: a
    kernel that has no kernel for a case did not run it) and, from the schedule, the cases it
    was tried on in order and whether it stopped at its first catch; the unmutated kernels'
    failures."""
    rows = []
    for m in mutants:
        caught, ran = [], 0
        for entry in gate["cases"]:
            if entry["candidate"] != f"mutant-{m.name}" or entry["verdict"] == Verdict.UNSUPPORTED:
                continue
            ran += 1
            if catches(entry):
                checks = sorted(
                    {t["verdict"] for t in entry["tensors"].values() if t["verdict"] not in NOT_A_CATCH}
                    or {entry["verdict"]}
                )
                tensors = sorted(n for n, t in entry["tensors"].items() if t["verdict"] not in NOT_A_CATCH)
                where = {n: describe_localisation(entry["tensors"][n].get("localisation")) for n in tensors}
                caught.append(
                    {
                        "case_id": entry["case_id"],
                        "checks": checks,
                        "tensors": tensors,
                        "where": {n: w for n, w in where.items() if w},
                    }
                )
        row = {
            "mutant": m.name,
            "seed": m.seed,
            "what": m.what,
            "cases_run": ran,
            "caught": bool(caught),
            "caught_by": caught,
        }
        if schedule is not None:
            tried = schedule.tried[m.name]
            if not schedule.all_cases:  # the gate's entries in the order the mutant ran them
                order = {c: i for i, c in enumerate(tried)}
                row["caught_by"].sort(key=lambda cb: order.get(cb["case_id"], len(order)))
            row.update(
                stops_at_first_catch=not schedule.all_cases,
                cases_of_op=len(schedule.order[m.name]),
                cases_tried=tried,
            )
        rows.append(row)
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
    stops = any(r.get("stops_at_first_catch") for r in result["mutants"])
    lines = []
    if stops:
        lines.append("each mutant stopped at the first case that caught it (--all-cases: every case of its op)")
    lines.append(f"{'mutant':30s} {'seed':5s} {'cases':>7s}  caught by")
    for r in result["mutants"]:
        if r["caught"]:
            checks = sorted({c for cb in r["caught_by"] for c in cb["checks"]})
            first = r["caught_by"][0]
            detail = f"({', '.join(first['tensors']) or first['checks'][0]})"
            if stops:
                by = f"{first['case_id']} [{', '.join(first['checks'])}] {detail}"
            else:
                by = f"{len(r['caught_by'])} case(s) [{', '.join(checks)}], e.g. {first['case_id']} {detail}"
            if first.get("where"):
                name, where = next(iter(first["where"].items()))
                by += f"\n{'':45s}at {name}: {where}"
        else:
            why = (
                ""
                if r["cases_run"]
                else f" (its kernel supports none of its op's {r['cases_of_op']} cases)"
                if r.get("cases_of_op")
                else " (no case of its op selected)"
            )
            by = "NOT CAUGHT" + why
        n = f"{r['cases_run']}/{r['cases_of_op']}" if "cases_of_op" in r else str(r["cases_run"])
        lines.append(f"{r['mutant']:30s} {r['seed'] or '-':5s} {n:>7s}  {by}")
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
