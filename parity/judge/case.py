"""The gate's judgement of one case (`judge_case`): each candidate's records against the reference's
and its TPU compile records, as a CaseJudgement; every failure the gate reports is a `Failure`.
A pure function of the records: `parity gate` (parity.judge.gate.evaluate), the page, the pytest
plugin, parity fuzz and parity mutants all judge a case with it. The rules are parity.judge.gate's
module docstring."""

from __future__ import annotations

import dataclasses

from cases import Case
from parity.judge.bound import bound
from parity.judge.compiles import compile_problems
from parity.judge.environment import known_wrong_tensors, reference_fallback, reference_refusal, unbounded_by
from parity.judge.load import GateRefusal
from parity.judge.words import describe_bound, describe_localisation, fmt
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN
from parity.measure.localisation import bound_localisation, localisation_record
from parity.model.spec import REFERENCE
from parity.model.verdict import UNJUDGED, Verdict, worst_verdict
from parity.records import tpu_kernel_problem


@dataclasses.dataclass(frozen=True)
class Failure:
    """One entry of the gate's failures list (and of its inconclusive, unsupported and not_judged
    lists): what did not pass, where. A judged tensor's entry carries its figures (eps_candidate,
    eps_reference: rel_rms on the case's own seed; c_candidate, c_reference, ratio, interval,
    seeds: the compute errors judged over the seeds; tol; localisation; rule: the rule that
    decided it, why: that rule with its figures); any other entry says what went wrong in `detail`."""

    case_id: str  # "*": every case of the candidate
    candidate: str
    tensor: str | None  # None: the (case, candidate) as a whole
    verdict: str  # a Verdict (parity.model.verdict)
    detail: str = ""
    figures: dict | None = None
    repro: str | None = None  # the command that reproduces it (tensor and compile entries)

    def as_dict(self) -> dict:
        """The entry as gate.json holds it and parity.judge.summary prints it."""
        head = {"case_id": self.case_id, "candidate": self.candidate, "tensor": self.tensor, "verdict": self.verdict}
        if self.figures is not None:
            return {**head, **self.figures, "repro": self.repro}
        return {**head, "detail": self.detail, **({"repro": self.repro} if self.repro is not None else {})}


@dataclasses.dataclass(frozen=True)
class CaseJudgement:
    """The gate's judgement of one case. `entries`: one per candidate, as gate.json's "cases" list
    holds them (verdict, tensors with accuracy, bound, rule and why (the rule that decided the
    tensor's verdict, and with its figures), localisation and where (it in words); compile); a candidate with
    compile records only has an entry whose reference is None. `failures` (of the results) and
    `compile_failures` (of the TPU compile records) fail the case; `inconclusive`: undecided
    tensors that allow_inconclusive lets pass; `unsupported` and `not_judged`: what was not
    compared; `findings`: the reference's own problems; `unbounded`: candidates held to their
    own tolerance only, the reference giving nothing to bound them by (no such tensor, NaN/Inf,
    a failure of its own); `unbounded_by_environment`: those the reference's environment left
    unbounded (FLA refused there, or computed the tensor with a kernel known wrong there:
    parity.judge.environment), one per (candidate, issue), with cause and fix; their tensors that
    pass their tolerance are `unbounded-reference`, a failure unless allow_unbounded_reference
    (then in `unbounded_reference`); `reference_fallback`: the reference's notes.fallback (FLA
    recomputed in the Triton interpreter after CUDA refused) or None. `refused`: why the case
    cannot be compared (nothing else is filled then)."""

    case_id: str
    entries: tuple[dict, ...] = ()
    failures: tuple[Failure, ...] = ()
    compile_failures: tuple[Failure, ...] = ()
    inconclusive: tuple[Failure, ...] = ()
    unsupported: tuple[Failure, ...] = ()
    not_judged: tuple[Failure, ...] = ()
    findings: tuple[dict, ...] = ()
    unbounded: tuple[dict, ...] = ()
    unbounded_by_environment: tuple[dict, ...] = ()
    unbounded_reference: tuple[Failure, ...] = ()
    reference_fallback: dict | None = None
    refused: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.refused or self.failures or self.compile_failures)

    @property
    def verdict(self) -> str:
        """The worst verdict of the case's entries; "refused" when the case cannot be compared."""
        return "refused" if self.refused else worst_verdict(e["verdict"] for e in self.entries)

    def entry(self, candidate: str) -> dict | None:
        return next((e for e in self.entries if e["candidate"] == candidate), None)


def judge_case(
    case_id: str,
    records: dict[str, dict] | None,
    compiles: dict[str, dict] | None = None,
    factor: float = 1.0,
    reference: str = REFERENCE,
    allow_inconclusive: bool = False,
    allow_unbounded_reference: bool = False,
) -> CaseJudgement:
    """The gate's judgement of case `case_id` from its records (backend -> result record; None:
    judge its compile records only) and its compile records (backend -> compile record).
    allow_inconclusive, allow_unbounded_reference: those verdicts pass, listed apart."""
    try:
        entries, problems, findings = _judge_results(case_id, records, factor, reference)
    except GateRefusal as e:
        return CaseJudgement(case_id, refused=str(e))
    entries, compile_failures = _join_compiles(case_id, entries, compiles or {})
    allowed = (Verdict.INCONCLUSIVE,) * allow_inconclusive + (Verdict.UNBOUNDED_REFERENCE,) * allow_unbounded_reference
    ref = (records or {}).get(reference)
    return CaseJudgement(
        case_id,
        entries=tuple(entries),
        failures=tuple(f for f in problems if f.verdict not in (*UNJUDGED, *allowed)),
        compile_failures=tuple(compile_failures),
        inconclusive=tuple(f for f in problems if f.verdict == Verdict.INCONCLUSIVE and allow_inconclusive),
        unsupported=tuple(f for f in problems if f.verdict == Verdict.UNSUPPORTED),
        not_judged=tuple(f for f in problems if f.verdict == Verdict.NOT_JUDGED),
        findings=tuple(findings),
        unbounded=tuple(u for u in map(_unbounded, entries) if u),
        unbounded_by_environment=tuple(
            {**u, "allowed": allow_unbounded_reference} for e in entries for u in _unbounded_by_environment(e)
        ),
        unbounded_reference=tuple(
            f for f in problems if f.verdict == Verdict.UNBOUNDED_REFERENCE and allow_unbounded_reference
        ),
        reference_fallback=reference_fallback(ref) if ref else None,
    )


def _judge_results(
    case_id: str, records: dict[str, dict] | None, factor: float, reference: str
) -> tuple[list[dict], list[Failure], list[dict]]:
    """(an entry per candidate, every tensor or candidate that did not pass, the reference's
    findings); nothing without records; GateRefusal when the records cannot be compared."""
    if records is None:
        return [], [], []
    _check_consistent(case_id, records)
    ref = records.get(reference)
    cands = {b: r for b, r in records.items() if r["side"] == "candidate"}
    if ref is None:
        raise GateRefusal(f"case {case_id}: no {reference!r} (reference) result in the given directories")
    if not cands:
        raise GateRefusal(f"case {case_id}: no candidate (pallas or --candidate) result in the given directories")
    entries, problems = [], []
    environment = (reference_refusal(ref), known_wrong_tensors(ref))
    for cname, cand in sorted(cands.items()):
        entry = _candidate_entry(case_id, cname, cand, ref, reference, factor, environment)
        entries.append(entry)
        problems += _candidate_problems(entry, cand, ref)
    return entries, problems, _reference_findings(case_id, ref, environment[0])


def _check_consistent(case_id: str, recs: dict[str, dict]) -> None:
    for field in ("input_hash", "oracle_version", "tol_version"):
        values = {b: r.get(field) for b, r in recs.items()}
        if len(set(values.values())) > 1:
            detail = ", ".join(f"{b}={str(v)[:16]}" for b, v in sorted(values.items()))
            raise GateRefusal(f"case {case_id}: {field} differs between backends ({detail}); refusing to compare")


def _reference_findings(case_id: str, ref: dict, refusal: dict | None = None) -> list[dict]:
    """The reference's own problems: a run that failed (refused by its environment: the refusal's
    issue, cause and fix), tensors outside tolerance or non-finite."""
    out = []
    if ref["status"] != "ok":
        what = (
            f"refused by its environment, {refusal['issue']}: {refusal['cause']}; fix: {refusal['fix']}"
            if refusal
            else (ref.get("error") or "")[:200]
        )
        out.append({"case_id": case_id, "tensor": None, "finding": f"reference {ref['status']}: {what}"})
    for name, t in ref.get("tensors", {}).items():
        if t.get("verdict") in (Verdict.FAIL_ACCURACY, Verdict.NAN_INF):
            out.append(
                {
                    "case_id": case_id,
                    "tensor": name,
                    "finding": f"reference {t['verdict']}",
                    "rel_rms": t.get("rel_rms"),
                    "tol": t.get("tol"),
                }
            )
    return out


def _nothing_compared(cand: dict) -> str | None:
    """Why an ok record judges nothing: an output it has no entry for, or no tensor compared."""
    unseen = [n for n in Case.from_dict(cand["case"]).output_names() if n not in cand["tensors"]]
    if unseen:
        return f"record has no entry for {', '.join(unseen)}"
    if not any(t["verdict"] not in UNJUDGED for t in cand["tensors"].values()):
        return "status ok but no tensor compared"
    return None


def _candidate_entry(
    case_id: str, cname: str, cand: dict, ref: dict, reference: str, factor: float, environment: tuple = (None, {})
) -> dict:
    """The candidate's entry: its verdict (the worst of its tensors'; error for a Pallas TPU
    kernel that did not run as one) and each tensor's accuracy and bound. `environment`: the
    reference's (refusal, known-wrong tensors) (parity.judge.environment)."""
    entry = {
        "case_id": case_id,
        "candidate": cname,
        "reference": reference,
        "candidate_platform": cand.get("platform"),
        "reference_platform": ref.get("platform"),
        "tensors": {},
    }
    if cand["status"] != "ok":
        return {**entry, "verdict": cand["status"], "error": cand.get("error")}
    why = _nothing_compared(cand)
    if why:
        return {**entry, "verdict": Verdict.ERROR, "error": why}
    for name, ct in cand["tensors"].items():
        entry["tensors"][name] = _judge_tensor(case_id, name, ct, ref, cand, factor, environment)
    entry["verdict"] = worst_verdict(t["verdict"] for t in entry["tensors"].values())
    problem = tpu_kernel_problem(cand)
    if problem:  # never passed, whatever its tensors
        entry.update(verdict=Verdict.ERROR, error=problem)
    return entry


def _judge_tensor(
    case_id: str, name: str, ct: dict, ref: dict, cand: dict, factor: float, environment: tuple = (None, {})
) -> dict:
    """One tensor's entry: its accuracy verdict, then the bound against the reference's tensor
    (or why there is none), the verdict both give and, when it fails, where. A reference tensor
    known wrong bounds nothing; where the reference's environment left the tensor unbounded
    (`unbounded_by`), a tensor within its tolerance is `unbounded-reference`."""
    refusal, wrong = environment
    rt = ref.get("tensors", {}).get(name)
    why_unbounded = unbounded_by(refusal if rt is None else None, wrong.get(name))
    t = {
        "accuracy": ct["verdict"],
        "rel_rms": ct.get("rel_rms"),
        "max_abs": ct.get("max_abs"),
        "tol": ct.get("tol"),
        "dtype": ct.get("dtype"),
    }
    verdict = ct["verdict"]
    if verdict not in UNJUDGED and rt is not None and "rel_rms" in rt and why_unbounded is None:
        try:
            b = bound(ct, rt, factor, *_seed_policy(cand))
        except ValueError as e:
            raise GateRefusal(f"case {case_id}, {name}: {e}; refusing to compare") from None
        t["bound"] = b
        if verdict == Verdict.PASS and not b["ok"]:
            verdict = b["verdict"]
    else:
        t["bound"] = None
        if verdict in UNJUDGED:
            t["bound_note"] = "candidate has no such tensor" if verdict == Verdict.UNSUPPORTED else ct.get("reason", "")
        elif why_unbounded:
            t["bound_note"] = f"the reference's environment ({why_unbounded['issue']}): {why_unbounded['cause']}"
            t["unbounded_by"] = why_unbounded
            verdict = Verdict.UNBOUNDED_REFERENCE if verdict == Verdict.PASS else verdict
        else:
            t["bound_note"] = f"reference has no {name}: {(rt or {}).get('reason', ref['status'])}"
    t["verdict"] = verdict
    if verdict == Verdict.FAIL_BOUND:
        t["localisation"] = localisation_record(bound_localisation(Case.from_dict(cand["case"]), name, ct, rt, factor))
    elif verdict not in (Verdict.PASS, *UNJUDGED):
        t["localisation"] = ct.get("localisation", {})
    t["rule"], t["why"] = _rule(t, ct)
    if t.get("localisation"):
        t["where"] = describe_localisation(t["localisation"])
    return t


def _rule(t: dict, ct: dict) -> tuple[str, str]:
    """(the rule that decided tensor entry `t`'s verdict, that rule with its figures): the
    tolerance or NaN/Inf check of the candidate's record, else the bound's (BOUND_RULES); an
    unjudged tensor's verdict and reason."""
    v, b = t["verdict"], t.get("bound")
    if v in UNJUDGED:
        return v, f"{v}: {ct.get('reason', '')}"
    if t["accuracy"] != Verdict.PASS:
        return tolerance_rule(ct)
    if v == Verdict.UNBOUNDED_REFERENCE:
        u = t["unbounded_by"]
        return v, f"{v}: bound not enforced, {u['issue']}: {u['cause']}; fix: {u['fix']}; {tolerance_rule(ct)[1]}"
    if not b:
        rule, why = tolerance_rule(ct)
        return rule, f"{why}; no bound ({t.get('bound_note', '')})"
    why = describe_bound(b)
    w = (ct.get("worst") or [{}])[0]
    if b["rule"] == "max-abs" and w.get("index") is not None:
        why += f"; the element furthest off: index {w['index']} (value {fmt(w['value'])}, oracle {fmt(w['oracle'])})"
    return b["rule"], why


def tolerance_rule(ct: dict) -> tuple[str, str]:
    """(rule, that rule with its figures) of a tensor record's own verdict against the oracle:
    nan-inf (NaN/Inf where the oracle is finite) or tolerance (rel_rms against tol)."""
    if ct["verdict"] == Verdict.NAN_INF:
        return "nan-inf", f"nan-inf: {ct.get('nan', 0)} NaN and {ct.get('inf', 0)} Inf where the oracle is finite"
    eps, tol = ct.get("rel_rms"), ct.get("tol")
    return "tolerance", f"tolerance: rel_rms {fmt(eps)} {'<=' if ct['verdict'] == Verdict.PASS else '>'} tol {fmt(tol)}"


def deciding_tensor(entry: dict) -> str | None:
    """The tensor whose verdict is the (case, candidate) entry's, the first in the entry's order;
    None where the entry's verdict is not a tensor's (an error, a timeout, a compile failure)."""
    return next((n for n, t in (entry.get("tensors") or {}).items() if t["verdict"] == entry["verdict"]), None)


def _seed_policy(cand: dict) -> tuple[int, int]:
    """(seeds_min, seeds_max) a verdict needs: what the candidate's run asked for (parity run --seeds;
    SEEDS_MIN, SEEDS_MAX where its record does not say). The reference only supplies figures: a
    reference run with more seeds than that (each side on its own machine) is fine."""
    pol = cand.get("seed_policy") or {"min": SEEDS_MIN, "max": SEEDS_MAX}
    return pol["min"], pol["max"]


def _candidate_problems(entry: dict, cand: dict, ref: dict) -> list[Failure]:
    """A Failure for the candidate as a whole when it did not run or compared nothing; else one
    per tensor that did not pass (unsupported, not judged and inconclusive included), one per
    issue of the reference's environment that left tensors unbounded-reference (naming them),
    and one when it is a Pallas TPU kernel that did not run as one."""
    case_id, cname = entry["case_id"], entry["candidate"]
    if cand["status"] != "ok":
        error = cand.get("error")
        return [Failure(case_id, cname, None, cand["status"], error.splitlines()[0][:200] if error else "")]
    if not entry["tensors"]:
        return [Failure(case_id, cname, None, Verdict.ERROR, entry["error"])]
    out = []
    for name, t in entry["tensors"].items():
        ct = cand["tensors"][name]
        if t["verdict"] in UNJUDGED:
            out.append(Failure(case_id, cname, name, t["verdict"], ct.get("reason", "")))
        elif t["verdict"] not in (Verdict.PASS, Verdict.UNBOUNDED_REFERENCE):
            rt = ref.get("tensors", {}).get(name)
            out.append(
                Failure(case_id, cname, name, t["verdict"], figures=_figures(ct, rt, t), repro=cand.get("repro"))
            )
    out += [  # one per issue of the reference's environment, naming its tensors, cause and fix
        Failure(
            case_id,
            cname,
            None,
            Verdict.UNBOUNDED_REFERENCE,
            f"{', '.join(u['failing'])}: bound not enforced, {u['issue']}: {u['cause']}; fix: {u['fix']}",
        )
        for u in _unbounded_by_environment(entry)
        if u["failing"]
    ]
    problem = tpu_kernel_problem(cand)
    if problem:
        out.append(Failure(case_id, cname, None, Verdict.ERROR, problem))
    return out


def _figures(ct: dict, rt: dict | None, t: dict) -> dict:
    """A judged tensor's Failure figures: epsilons (rel_rms, the case's own seed), compute errors
    and their ratio with its interval (over the seeds judged)."""
    b = t.get("bound") or {}
    rr = b.get("rel_rms") or {}
    j = b.get("compute") or {}
    return {
        "eps_candidate": ct.get("rel_rms"),
        "eps_reference": (rt or {}).get("rel_rms"),
        "c_candidate": j.get("c_candidate"),
        "c_reference": j.get("c_reference"),
        "ratio": rr.get("ratio"),
        "interval": [j.get("lo"), j.get("hi")] if j.get("method") == "ratio" else None,
        "seeds": j.get("seeds"),
        "tol": ct.get("tol"),
        "localisation": t.get("localisation", {}),
        "rule": t["rule"],  # the rule that decided the verdict (judge_case's _rule), and with its figures:
        "why": t["why"],
    }


def _unbounded(entry: dict) -> dict | None:
    """The candidate's judged tensors the reference gave nothing to bound by (no such tensor, or
    one with NaN/Inf) for a reason other than its environment's: held to their own tolerance only."""
    tensors = entry["tensors"]
    free = [
        n
        for n, v in tensors.items()
        if v["verdict"] not in UNJUDGED
        and "unbounded_by" not in v
        and (not v["bound"] or v["bound"].get("reference_nonfinite"))
    ]
    if not free:
        return None
    reason = tensors[free[0]].get("bound_note") or f"reference {free[0]} has NaN/Inf"
    return {"case_id": entry["case_id"], "candidate": entry["candidate"], "tensors": free, "reason": reason}


def _unbounded_by_environment(entry: dict) -> list[dict]:
    """One {"case_id", "candidate", "issue", "by", "cause", "fix", "tensors", "failing"} per issue
    of the reference's environment that left the candidate's judged tensors unbounded; `failing`:
    those of them that are unbounded-reference (the rest fail on their own tolerance)."""
    out: dict[str, dict] = {}
    for name, t in entry["tensors"].items():
        u = t.get("unbounded_by")
        if u:
            x = out.setdefault(
                u["issue"],
                {"case_id": entry["case_id"], "candidate": entry["candidate"], **u, "tensors": [], "failing": []},
            )
            x["tensors"].append(name)
            x["failing"] += [name] if t["verdict"] == Verdict.UNBOUNDED_REFERENCE else []
    return list(out.values())


def _join_compiles(case_id: str, entries: list[dict], compiles: dict[str, dict]) -> tuple[list[dict], list[Failure]]:
    """The entries with each candidate's compile verdicts joined (a candidate with compile records
    only gets an entry of its own), and a Failure per problem of a compile that did not pass."""
    by_candidate = {e["candidate"]: e for e in entries}
    failures = []
    for backend, rec in sorted(compiles.items()):
        entry = by_candidate.get(backend) or {
            "case_id": case_id,
            "candidate": backend,
            "reference": None,
            "tensors": {},
            "verdict": Verdict.PASS,
            "candidate_platform": "compile only (no execution)",
        }
        entry = {
            **entry,
            "compile": {t: ("ok" if r["ok"] else r.get("error_line") or "error") for t, r in rec["targets"].items()},
        }
        if rec["verdict"] != Verdict.PASS:
            entry["verdict"] = worst_verdict([entry["verdict"], rec["verdict"]])
            failures += [
                Failure(case_id, backend, None, rec["verdict"], line, repro=rec.get("repro"))
                for line in compile_problems(rec)
            ]
        by_candidate[backend] = entry
    return list(by_candidate.values()), failures
