"""Whether a mutant was caught: a gate entry of it that is a catch (catches), and the judge a
MutantSchedule asks during the run, over the records one case's unit wrote (judge_record)."""

from __future__ import annotations

from pathlib import Path

from parity.judge.case import judge_case
from parity.model.spec import REFERENCE
from parity.model.verdict import Verdict
from parity.records import (
    RecordError,
    check_compile,
    check_result,
    read_checked,
    result_path,
)

# unbounded-reference: the reference's environment's
NOT_A_CATCH = (Verdict.PASS, Verdict.UNSUPPORTED, Verdict.UNBOUNDED_REFERENCE)


def catches(entry: dict) -> bool:
    """Whether a gate entry of a mutant catches it: any verdict but NOT_A_CATCH's (a tensor the
    reference's environment left unbounded says nothing of the mutant)."""
    return entry["verdict"] not in NOT_A_CATCH


def judge_record(out: Path, factor: float, run_id: str):
    """judge(case, backend) for MutantSchedule: whether the gate fails `backend`'s record of
    `case` in `out` (written by run `run_id`), against FLA's record and with its TPU compile
    record; None when a record is missing, unreadable or of another run."""

    def read(path: Path, check) -> dict | None:
        try:
            rec = read_checked(path)
            check(rec, path)
        except RecordError:
            return None
        return rec if rec.get("run_id") == run_id else None

    def judge(case, backend: str) -> bool | None:
        ref = read(result_path(out, REFERENCE, case.id), check_result)
        rec = read(result_path(out, backend, case.id), check_result)
        if ref is None or rec is None:
            return None
        comp = result_path(out, backend, case.id, kind="compile")
        compiles = {}
        if comp.exists():
            crec = read(comp, check_compile)
            if crec is None:
                return None
            compiles = {backend: crec}
        judged = judge_case(case.id, {REFERENCE: ref, backend: rec}, compiles, factor)
        if judged.refused:
            return None
        entry = judged.entry(backend)
        return entry is not None and catches(entry)

    return judge
