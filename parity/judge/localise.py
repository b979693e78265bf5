"""Which stage of an op went wrong: each stage of a failing op case judged alone, in the order
the stages run (cases.suites.stage_cases), and the first one over its bound named.

`localise_stages` is a pure function of a run's records: the op case judged for the candidate,
each of its stage cases judged for the candidate's stages (the same gate, judge_case), against
FLA's stage functions. A stage passes, fails for a numerical reason (nan-inf, fail-accuracy,
fail-bound) or a compile reason (compile-error, numerics-mismatch: it does not compile for a TPU
target, or not as the numerics model says), could not be judged (an error, a timeout, an
undecided bound, a refused record: listed with the reason), or was not given (the candidate's
stages decline it: unsupported, or no record). The first stage that fails names where the op went
wrong. `parity localise` (parity.cli.localise) runs the cases and prints it; the page shows it
beside the op.
"""

from __future__ import annotations

from cases import Case
from cases.suites import stage_cases
from parity.judge.case import deciding_tensor, judge_case
from parity.model.spec import REFERENCE
from parity.model.verdict import UNJUDGED, Verdict

NUMERICAL = (Verdict.NAN_INF, Verdict.FAIL_ACCURACY, Verdict.FAIL_BOUND)
COMPILE = (Verdict.COMPILE_ERROR, Verdict.NUMERICS_MISMATCH)


def _judged(case: Case, records: dict, compiles: dict, candidate: str, factor: float) -> dict:
    """The candidate's verdict on one case (its TPU compile records too), the tensor that decided
    it and its figures."""
    recs = records.get(case.id)
    if not recs or candidate not in recs:
        return {"case_id": case.id, "verdict": "missing", "detail": f"no {candidate} record"}
    mine = {n: r for n, r in compiles.get(case.id, {}).items() if n == candidate}
    judged = judge_case(case.id, {n: r for n, r in recs.items() if n in (REFERENCE, candidate)}, mine, factor)
    if judged.refused:
        return {"case_id": case.id, "verdict": "refused", "detail": judged.refused}
    entry = judged.entry(candidate) or {}
    out = {"case_id": case.id, "verdict": entry.get("verdict", "missing")}
    if entry.get("error"):
        out["detail"] = entry["error"].splitlines()[0]
    out["repro"] = recs[candidate].get("repro", "")
    broken = [f for f in judged.compile_failures if f.candidate == candidate]
    if broken:  # a TPU compile failure: its message and the command that repeats the compile
        out["verdict"] = out["verdict"] if out["verdict"] in NUMERICAL else broken[0].verdict
        out.setdefault("detail", (broken[0].detail.splitlines() or [""])[0][:240])
        out["repro"] = broken[0].repro or out["repro"]
    tensor = deciding_tensor(entry) if entry.get("tensors") else None
    if tensor:
        t = entry["tensors"][tensor]
        out.update(tensor=tensor, why=t.get("why", ""), where=t.get("where", ""))
    return out


def failed(verdict: str) -> bool:
    """A verdict that puts a case over its bound (or breaks it): any but pass and the unjudged."""
    return verdict not in (Verdict.PASS, *UNJUDGED, "missing")


def localise_stages(
    case: Case,
    records: dict[str, dict[str, dict]],
    candidate: str,
    stage_candidate: str,
    factor: float = 1.0,
    compiles: dict[str, dict[str, dict]] | None = None,
) -> dict:
    """{"case", "candidate", "op": the op case's judgement, "stages": each stage's, in order,
    "first": the first stage that failed (None: none did), "given": the stages the candidate's
    stages ran}. records, compiles: case id -> backend -> result or TPU compile record
    (records.load_latest); a stage whose TPU compile fails has failed."""
    compiles = compiles or {}
    op = _judged(case, records, compiles, candidate, factor)
    stages = []
    for sc in stage_cases(case):
        stages.append({"stage": sc.stage, **_judged(sc, records, compiles, stage_candidate, factor)})
    first = next((s for s in stages if s["verdict"] in NUMERICAL + COMPILE), None)
    given = [s for s in stages if s["verdict"] not in (Verdict.UNSUPPORTED, "missing")]
    return {
        "case": case.id,
        "candidate": candidate,
        "stage_candidate": stage_candidate,
        "op": op,
        "stages": stages,
        "first": first["stage"] if first else None,
        "given": [s["stage"] for s in given],
        "not_judged": [
            {"stage": s["stage"], "verdict": s["verdict"], "why": s.get("detail") or s.get("why") or ""}
            for s in given
            if s["verdict"] not in (Verdict.PASS, *NUMERICAL, *COMPILE)
        ],
    }


def describe(result: dict) -> str:
    """The localisation in words: the op's verdict, one line per stage, the first stage over."""
    op = result["op"]
    lines = [f"{result['case']}  {result['candidate']}: {op['verdict']}" + _figures(op)]
    for s in result["stages"]:
        mark = "<- the first that fails" if s["stage"] == result["first"] else ""
        lines.append(f"  {s['stage']:<14} {s['verdict']:<14}{_figures(s)} {mark}".rstrip())
    if result["first"]:
        first = next(s for s in result["stages"] if s["stage"] == result["first"])
        reason = "does not compile" if first["verdict"] in COMPILE else "over its bound"
        lines.append(f"first stage that fails: {result['first']}, {first['verdict']}: {reason} ({first['case_id']})")
        lines.append(f"  repro: {first['repro']}")
    elif not result["given"]:
        lines.append(f"no stage ran: {result['stage_candidate']} gives none of this op's stages")
    elif failed(op["verdict"]) and not result.get("not_judged"):
        lines.append("every stage given is within its bound: the op's error is in how the stages are put together")
    for s in result.get("not_judged", []):
        lines.append(f"not judged: {s['stage']}: {s['verdict']}" + (f": {s['why']}" if s["why"] else ""))
    return "\n".join(lines)


def _figures(j: dict) -> str:
    if j.get("tensor"):
        return f"  {j['tensor']}: {j.get('why', '')}" + (f"; {j['where']}" if j.get("where") else "")
    return f"  {j['detail']}" if j.get("detail") else ""
