"""`parity gate DIR [DIR ...]`: merge results from any machines and enforce TPU <= GPU.

For every case, every candidate backend (pallas, pallas-fused, user candidates: the "TPU"
side) and every tensor:
    accuracy   eps_candidate <= tol(case, tensor)                   (parity.measure.tol)
    bound      compute error c = sqrt(eps^2 - floor^2) (the error apart from the output's
               rounding): c_candidate <= factor * c_reference, judged over seeds with a
               confidence interval from the data (parity.measure.compute_error): fail when the
               interval lies above factor, pass when it lies at or below factor x (1 + MARGIN),
               otherwise `inconclusive` (a failure unless allow_inconclusive: --allow-inconclusive);
               and max_abs <= factor * max_abs_reference + floor_abs
    nan-inf    NaN or Inf where the oracle is finite fails, always
The reference is FLA (the "GPU" side). A reference tensor outside its own tolerance is
reported as a finding about the reference; the bound still uses it (except where the
reference has NaN/Inf or failed to run: then it bounds nothing, the candidate must still
meet its own tolerance, and the summary lists those pairs as "bound not enforced").
Where the reference's environment is why it bounds nothing (parity.judge.environment: FLA
refused to run there, e.g. fla#640 on Hopper with Triton < 3.7.1, or ran a kernel known to
compute that tensor wrong there, e.g. fla#984), the candidate's tensors within tolerance are
`unbounded-reference`: listed apart per cause with its fix ("unbounded_by_environment"), and a
failure unless allow_unbounded_reference (--allow-unbounded-reference; then listed as allowed).
A reference FLA recomputed in the Triton interpreter after CUDA refused (notes.fallback) bounds
as any other; the summary counts them.

The gate refuses (exit 2) to compare records whose schema, oracle version, tolerance
version or input hash differ for a case, and cases that lack a reference or a candidate.
It fails closed on what it cannot see (parity.records.manifest): it refuses a directory without a
manifest, a case and backend a manifest lists with no readable record, and any unreadable
or malformed *.json record; records no manifest lists are ignored (and counted).
`allow_partial` (`--allow-partial`) gates what is readable instead and lists the rest.
A candidate whose record says ok but that compared no tensor fails that case; one that
compared no tensor on any case fails the gate ("unsupported everywhere"). A forward-only
candidate (parity.execute.backends.calling.forward_case) is judged on the forward tensors of a
forward-and-backward case; its backward tensors are "not-judged" (listed, neither failed,
unsupported nor passed; the case's entry is "not-judged" when its judged tensors pass).
TPU compile records (parity.execute.tpu_compile; `parity run --tpu-targets`, `parity compile`) are
held to the manifests the same way: a run with TPU targets must have a compile record for
every candidate record that ran, covering every target. A candidate that does not compile
for a requested target fails with verdict compile-error (target and Mosaic's message); one
whose compiled matmuls disagree with the numerics model fails with numerics-mismatch. The
summary gives the compile matrix. The gate also refuses a candidate whose records were
computed under different numerics models (parity.measure.tpu_numerics) unless allow_mixed_numerics.
Exit 0 when every check passes, 1 on any failure.
Judging one case is parity.judge.case's (judge_case); `evaluate` judges every case with it and
collects. Reading the directories against their manifests is parity.judge.load's, the compile
records' figures parity.judge.compiles's, the text of the verdict parity.judge.summary's; all are
importable from here too (__all__).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from parity.judge.case import CaseJudgement, Failure, judge_case
from parity.judge.compiles import compile_problems, compile_summary
from parity.judge.load import GateRefusal, load, load_checked, load_compiles
from parity.judge.summary import format_compile_summary, format_summary
from parity.model.spec import REFERENCE
from parity.model.verdict import UNJUDGED, Verdict
from parity.records import SCHEMA_VERSION, ByCase, write_json

# judge_case, load, load_compiles, compile_problems, format_summary, format_compile_summary:
# imported from here by the surfaces
__all__ = [
    "CaseJudgement",
    "Failure",
    "GateRefusal",
    "compared_nothing",
    "compile_problems",
    "compile_summary",
    "evaluate",
    "format_compile_summary",
    "format_summary",
    "judge_case",
    "load",
    "load_checked",
    "load_compiles",
    "run_gate",
]


def _check_numerics(by_case: dict[str, dict[str, dict]]) -> None:
    """One numerics model per candidate across everything merged."""
    seen: dict[str, dict[str, str]] = defaultdict(dict)
    for case_id, recs in by_case.items():
        for b, r in recs.items():
            if r.get("side") == "candidate" and r.get("status") == "ok":
                seen[b].setdefault(r.get("numerics") or "unrecorded", case_id)
    for b, models in seen.items():
        if len(models) > 1:
            detail = ", ".join(f"{m} (e.g. {c})" for m, c in sorted(models.items()))
            raise GateRefusal(
                f"candidate {b!r} has records computed under different numerics models: {detail}; "
                "rerun one side, or pass --allow-mixed-numerics"
            )


def evaluate(
    by_case: ByCase,
    factor: float = 1.0,
    reference: str = REFERENCE,
    compiles: dict[str, dict[str, dict]] | None = None,
    allow_mixed_numerics: bool = False,
    allow_inconclusive: bool = False,
    allow_unbounded_reference: bool = False,
) -> dict:
    """The gate's verdict for every case, candidate and tensor (and TPU compile, when compile
    records are given): judge_case for each case, collected. A tensor whose bound stays undecided
    over the seeds the records hold is `inconclusive`: a failure unless allow_inconclusive (then
    listed apart); one the reference's environment left unbounded is `unbounded-reference`: a
    failure unless allow_unbounded_reference. GateRefusal for the first case that cannot be compared."""
    compiles = compiles or {}
    if not allow_mixed_numerics:
        _check_numerics(by_case)
    judged = []
    for case_id in sorted(set(by_case) | set(compiles)):
        j = judge_case(
            case_id,
            by_case.get(case_id),
            compiles.get(case_id),
            factor,
            reference,
            allow_inconclusive,
            allow_unbounded_reference,
        )
        if j.refused:
            raise GateRefusal(j.refused)
        judged.append(j)
    allowed = {"inconclusive": allow_inconclusive, "unbounded_reference": allow_unbounded_reference}
    return _collect(judged, factor, reference, allowed, compile_summary(compiles))


def _collect(judged: list[CaseJudgement], factor: float, reference: str, allowed: dict, compile: dict | None) -> dict:
    """gate.json's form of the judgements: the entries of every case (those of candidates with
    compile records only last), the failures of results before those of compiles."""
    cases = sorted((e for j in judged for e in j.entries), key=lambda e: e["reference"] is None)
    failures = [f for j in judged for f in j.failures] + [f for j in judged for f in j.compile_failures]
    return {
        "schema": SCHEMA_VERSION,
        "kind": "gate",
        "bound_factor": factor,
        "reference": reference,
        "ok": not failures,
        "cases": cases,
        "failures": [f.as_dict() for f in failures],
        "reference_findings": [x for j in judged for x in j.findings],
        "unsupported": [f.as_dict() for j in judged for f in j.unsupported],
        # not judged: the backward tensors of forward-only candidates
        "not_judged": [f.as_dict() for j in judged for f in j.not_judged],
        "unbounded": [x for j in judged for x in j.unbounded],
        # left unbounded by the reference's environment, per (case, candidate, issue), with cause and fix
        "unbounded_by_environment": [x for j in judged for x in j.unbounded_by_environment],
        "inconclusive": [f.as_dict() for j in judged for f in j.inconclusive],
        "allow_inconclusive": allowed["inconclusive"],
        "unbounded_reference": [f.as_dict() for j in judged for f in j.unbounded_reference],  # allowed
        "allow_unbounded_reference": allowed["unbounded_reference"],
        # references FLA recomputed in the Triton interpreter after CUDA refused (notes.fallback)
        "reference_fallbacks": [
            {"case_id": j.case_id, "from": f.get("from"), "issue": (f.get("refusal") or {}).get("issue")}
            for j in judged
            if (f := j.reference_fallback)
        ],
        "compile": compile,
        "counts": {v: sum(1 for c in cases if c["verdict"] == v) for v in sorted({c["verdict"] for c in cases})},
    }


def compared_nothing(result: dict) -> list[dict]:
    """A failure for every candidate that compared no tensor on any case (and compiled nothing
    for TPU): nothing was shown to be as accurate as the reference, so it cannot pass."""
    seen: dict[str, bool] = {}
    for c in result["cases"]:
        seen[c["candidate"]] = (
            seen.get(c["candidate"], False)
            or "compile" in c
            or any(t["verdict"] not in UNJUDGED for t in c["tensors"].values())
        )
    n = Counter(c["candidate"] for c in result["cases"])
    return [
        Failure(
            "*",
            cand,
            None,
            Verdict.UNSUPPORTED,
            f"unsupported everywhere: compared no tensor on any of its {n[cand]} cases",
        ).as_dict()
        for cand, any_compared in sorted(seen.items())
        if not any_compared
    ]


def run_gate(
    dirs: list[Path],
    factor: float = 1.0,
    out: Path | None = None,
    allow_partial: bool = False,
    allow_mixed_numerics: bool = False,
    allow_inconclusive: bool = False,
    allow_unbounded_reference: bool = False,
) -> dict:
    """Load (load_checked), evaluate, write gate.json (to `out` or the first directory); raises GateRefusal."""
    by_case, compiles, coverage = load_checked(dirs, allow_partial)
    if not by_case and not compiles:
        raise GateRefusal(f"no result records under {', '.join(map(str, dirs))}")
    result = evaluate(
        by_case,
        factor,
        compiles=compiles,
        allow_mixed_numerics=allow_mixed_numerics,
        allow_inconclusive=allow_inconclusive,
        allow_unbounded_reference=allow_unbounded_reference,
    )
    nothing = compared_nothing(result)
    result["failures"] += nothing
    result["ok"] = result["ok"] and not nothing
    result["coverage"] = coverage
    write_json(Path(out) if out else Path(dirs[0]) / "gate.json", result)
    return result
