"""The property a search tests: the gate's verdict for the subject on one case (judge), read
from the records a runner worker wrote (read_records), with its margins per tensor."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from cases import Case
from parity.judge.case import judge_case
from parity.model.spec import REFERENCE
from parity.records import RecordError, check_result, read_checked, result_path

NOT_EVALUATED = ("unsupported", "oracle-failed")


@dataclasses.dataclass
class Judgement:
    verdict: str  # the gate's verdict for the subject, or one of NOT_EVALUATED
    detail: str = ""
    margins: dict = dataclasses.field(default_factory=dict)  # tensor -> {"eps/tol": x, "eps/bound": y}
    reference_findings: list = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.verdict not in ("pass",) + NOT_EVALUATED


def read_records(out_dir: Path, case: Case, lines: list[dict]) -> dict[str, dict]:
    """backend -> the record each summary line points to, read and checked as the gate reads
    them; a record that was not written or does not read back is an error record."""

    recs = {}
    for ln in lines:
        name = ln["backend"]
        try:
            if ln.get("written") is False:
                raise RecordError(f"record not written: {ln.get('error')}")
            rec = read_checked(result_path(out_dir, name, case.id))
            check_result(rec, result_path(out_dir, name, case.id))
        except RecordError as e:
            rec = {
                "backend": name,
                "side": ln["side"],
                "status": "error",
                "verdict": "error",
                "tensors": {},
                "error": f"the record cannot be read back: {e}",
            }
        recs[name] = rec
    return recs


def _ratio(x, limit) -> float | None:
    """x / limit; inf for a missing x (NaN/Inf); None when the limit is not a positive number."""
    if not isinstance(limit, (int, float)) or not limit > 0:
        return None
    return math.inf if x is None else x / limit


def judge(case: Case, records: dict[str, dict], subject: str, factor: float = 1.0) -> Judgement:
    """The gate's verdict for `subject` on one case, and its margins per tensor."""

    oracle = records.get("oracle")
    rec = records.get(subject)
    if oracle is None or oracle["status"] != "ok":
        return Judgement("oracle-failed", (oracle or {}).get("error") or "no oracle record")
    if rec is None:
        return Judgement("error", f"no record for {subject}")
    if rec["status"] == "unsupported":
        return Judgement("unsupported", rec.get("error") or "")
    if rec["status"] != "ok":
        first_line = (rec.get("error") or "").strip().splitlines()[:1]
        return Judgement(rec["verdict"], first_line[0][:300] if first_line else "")
    if rec["side"] == "candidate" and REFERENCE in records:
        judged = judge_case(case.id, records, factor=factor, reference=REFERENCE)
        if judged.refused:
            return Judgement("error", f"the gate refused the case: {judged.refused}")
        entry = judged.entry(subject)
        margins = {}
        for name, t in entry["tensors"].items():
            b = t.get("bound") or {}
            bounds = [_ratio(b[m]["candidate"], b[m]["limit"]) for m in ("rel_rms", "max_abs") if b.get(m)]
            bounds = [x for x in bounds if x is not None]
            margins[name] = {
                "eps/tol": _ratio(t.get("rel_rms"), t.get("tol")),
                "eps/bound": max(bounds) if bounds else None,
            }
        bad = [
            f"{n} {t['verdict']}" for n, t in entry["tensors"].items() if t["verdict"] not in ("pass", "unsupported")
        ]
        return Judgement(entry["verdict"], ", ".join(bad), margins, list(judged.findings))
    margins = {
        n: {"eps/tol": _ratio(t.get("rel_rms"), t.get("tol")), "eps/bound": None}
        for n, t in rec["tensors"].items()
        if t.get("verdict") != "unsupported"
    }
    bad = [f"{n} {t['verdict']}" for n, t in rec["tensors"].items() if t["verdict"] not in ("pass", "unsupported")]
    return Judgement(rec["verdict"], ", ".join(bad), margins)
