"""What the `parity_case` and `parity_check` fixtures do: the selected cases (select_cases), and
one case run through a marker's backends (check_case) with every problem explained (explain; what
the bound compares in words: describe_bound_quantity) and FLA's own failures reported as findings
(reference_findings). The harness is imported inside these functions: they run only when parity
tests do."""

from __future__ import annotations

import functools
from pathlib import Path

from parity.model import options  # standard library only (the option layer)
from parity.model.spec import REFERENCE  # standard library only (the backend spec's parser)
from parity.model.verdict import Verdict  # standard library only (the verdicts' vocabulary)


@functools.cache
def select_cases(
    suite: str | None,
    cases_file: str | None,
    op: str | None,
    max_elements: str | None = None,
    max_bytes: str | None = None,
) -> list:
    """The cases of --parity-cases (a file) or --parity-suite (default smoke), of one op if given,
    each within the size limits (texts as given; None: parity run's defaults); OptionError naming
    the option otherwise (parity.model.options.select_cases)."""
    from cases.inputs import MAX_INPUT_BYTES, MAX_INPUT_ELEMENTS  # late: the case registry (numpy)

    return options.select_cases(
        suite or (None if cases_file else "smoke"),
        cases_file,
        None,
        op,
        MAX_INPUT_ELEMENTS if max_elements is None else options.size_limit("max-elements", max_elements),
        MAX_INPUT_BYTES if max_bytes is None else options.size_limit("max-bytes", max_bytes),
    )


@functools.cache
def _backends(specs: tuple[str, ...]) -> dict:
    from parity.execute.case import build_backends  # late: heavy (jax, torch), only when parity tests run

    return build_backends(list(specs))


TOLERANCE_ONLY = "tolerance only"  # no gate for the case: each tensor against its tolerance alone


def explain(case, records: dict[str, dict], judged, allow_unbounded_reference: bool = False) -> list[str]:
    """One paragraph per problem: tensor, verdict (the gate's, as `parity run` and the page print
    it), the rule that decided it with its figures, both epsilons, tolerance, bound, worst element,
    where each side ran, and the command that reproduces just this case. `judged`: the gate's
    CaseJudgement of the case (parity.judge.case), or None where there is none (the tolerance alone
    then judges, and the paragraph says so). A reference its environment refused is a problem
    naming cause and fix, and a tensor it left unbounded-reference one, unless
    allow_unbounded_reference (then reference_findings reports the refusal)."""
    # late: numpy and scipy, only when parity tests run
    from parity.judge.case import tolerance_rule
    from parity.judge.environment import reference_refusal
    from parity.judge.words import describe_localisation, fmt
    from parity.measure.compute_error import describe as describe_compute

    ref = records.get(REFERENCE)
    problems = []
    for name, rec in records.items():
        if rec["side"] == "oracle":
            continue
        where = f"{name} ran on {rec.get('platform') or '?'}"
        if rec["status"] in ("error", "timeout"):
            refusal = reference_refusal(rec) if rec["side"] == "reference" else None
            if refusal and allow_unbounded_reference:
                continue  # a finding (reference_findings)
            error = (rec.get("error") or "").strip()[:1500]
            known = (
                f"\n  refused by its environment, {refusal['issue']}: {refusal['cause']}\n  fix: {refusal['fix']}"
                if refusal
                else ""
            )
            problems.append(f"[{name}] {rec['status']}: {error}{known}\n  {where}\n  repro: {rec['repro']}")
            continue
        if rec["side"] == "reference":  # its tensors' verdicts are findings, not failures
            continue
        for tname, t in rec.get("tensors", {}).items():
            entry = judged.entry(name) if judged and rec["side"] == "candidate" else None
            bound_entry = entry["tensors"].get(tname) if entry else None
            verdict = (bound_entry or t)["verdict"] if bound_entry else t["verdict"]
            if verdict in (Verdict.PASS, Verdict.UNSUPPORTED) or (
                verdict == Verdict.UNBOUNDED_REFERENCE and allow_unbounded_reference
            ):
                continue
            rt = (ref or {}).get("tensors", {}).get(tname, {})
            w = (t.get("worst") or [{}])[0]
            b = (bound_entry or {}).get("bound") or {}
            localisation = (bound_entry or {}).get("localisation") or t.get("localisation")
            eps = f"  eps_{name} (rel_rms) = {fmt(t.get('rel_rms'))}   eps_{REFERENCE} = {fmt(rt.get('rel_rms'))}"
            eps += f"   tol = {fmt(t.get('tol'))}"
            quantity = describe_bound_quantity(b, name, REFERENCE)
            if quantity:
                eps += f"\n  {quantity}"
            if b.get("compute"):
                eps += f"\n  {describe_compute(b['compute'])}"
            why = (bound_entry or {}).get("why") or f"{tolerance_rule(t)[1]} ({TOLERANCE_ONLY}: no gate for this case)"
            lines = [
                f"[{name}] {tname}: {verdict}",
                f"  decided by {why}",
                eps,
                f"  max_abs = {fmt(t.get('max_abs'))}  nan = {t.get('nan')}  inf = {t.get('inf')}",
                f"  worst index {w.get('index')}: value {w.get('value')} oracle {w.get('oracle')}",
                f"  localisation: {describe_localisation(localisation) or '-'}",
                f"  {where}; {REFERENCE} ran on {(ref or {}).get('platform') or 'n/a'}",
                f"  repro: {rec['repro']}",
            ]
            problems.append("\n".join(lines))
    return problems


def describe_bound_quantity(b: dict, candidate: str, reference: str) -> str:
    """What bound `b` (parity.judge.bound) compares, with its limit, in one line: the compute errors
    (the error apart from the output's rounding, over the seeds judged) or, where the reference's is
    at the rounding level, the epsilons pooled over those seeds; '' where no compute error was
    judged. A limit printed this way is never under the very figure of the reference it is made from."""
    # late: numpy and scipy, only when parity tests run
    from parity.judge.words import fmt

    j, rr = b.get("compute") or {}, b.get("rel_rms") or {}
    if not j or rr.get("limit") is None:
        return ""
    seeds = f"over {j['seeds']} seed(s)"
    if j["method"] == "ratio":
        return (
            f"bound on the compute error (the error apart from the output's rounding), {seeds}: "
            f"c_{candidate} = {fmt(rr['candidate'])} vs limit {fmt(rr['limit'])} = factor {fmt(b.get('factor'))} "
            f"x c_{reference} = {fmt(rr['reference'])}"
        )
    return (
        f"bound on epsilons pooled {seeds} ({reference}'s compute error at the rounding level): "
        f"eps_{candidate} = {fmt(rr['candidate'])} vs limit {fmt(rr['limit'])} = factor {fmt(b.get('factor'))} "
        f"x eps_{reference} = {fmt(rr['reference'])} + the output's rounding floor"
    )


def reference_findings(case, records: dict[str, dict], allow_unbounded_reference: bool = False) -> list[str]:
    """The reference's own tensors outside tolerance or non-finite: reported, never a test
    failure (the gate then bounds nothing with a non-finite reference tensor); with
    allow_unbounded_reference, its environment's refusal too (explain's problem otherwise)."""
    # late: numpy and the registry, only when parity tests run
    from parity.judge.environment import reference_refusal
    from parity.judge.words import fmt

    out = []
    for name, rec in records.items():
        if rec["side"] != "reference":
            continue
        refusal = reference_refusal(rec) if allow_unbounded_reference else None
        if refusal:
            out.append(
                f"{case.id}: reference {name} refused by its environment on {rec.get('platform')}, "
                f"{refusal['issue']}: {refusal['cause']}; fix: {refusal['fix']} (--parity-allow-unbounded-reference)"
            )
        for tname, t in rec.get("tensors", {}).items():
            if t.get("verdict") in (Verdict.FAIL_ACCURACY, Verdict.NAN_INF):
                w = (t.get("worst") or [{}])[0]
                out.append(
                    f"{case.id}: reference {name} {tname} {t['verdict']} (rel_rms {fmt(t.get('rel_rms'))}, "
                    f"tol {fmt(t.get('tol'))}, nan {t.get('nan')}, inf {t.get('inf')}, worst index "
                    f"{w.get('index')}) on {rec.get('platform')}"
                )
    return out


def check_case(
    case,
    mode: str,
    specs: list[str],
    report_dir: Path,
    run_id: str,
    factor: float,
    tpu_targets: tuple[str, ...] = (),
    allow_unbounded_reference: bool = False,
) -> tuple[list[str], str | None, list[str]]:
    """Run `case` through the backend `specs` of a marker, compiling its jax candidates for
    `tpu_targets`; returns (problems, why no candidate could run it or None, findings about
    the reference). allow_unbounded_reference: as `parity gate --allow-unbounded-reference`."""
    # late: heavy (jax, torch, the harness), only when parity tests run
    from parity.execute.case import run_case
    from parity.judge.gate import compile_problems, judge_case
    from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN

    recs, _, compiles = run_case(
        case, specs, _backends(tuple(specs)), report_dir, run_id, tpu_targets=tpu_targets, seeds=(SEEDS_MIN, SEEDS_MAX)
    )
    by_backend = {r["backend"]: r for r in recs}
    judged = None
    if REFERENCE in by_backend and any(r["side"] == "candidate" for r in recs):
        judged = judge_case(case.id, by_backend, factor=factor, allow_unbounded_reference=allow_unbounded_reference)
    cands = [r for r in recs if r["side"] == "candidate"]
    problems = explain(
        case, by_backend, None if judged is None or judged.refused else judged, allow_unbounded_reference
    ) + [
        f"[{c['backend']}] {c['verdict']}: {line}\n  repro: {c['repro']}"
        for c in compiles
        for line in compile_problems(c)
    ]
    no_kernel = None
    if cands and all(r["status"] == "unsupported" for r in cands):
        no_kernel = "; ".join(f"{r['backend']}: {r.get('error')}" for r in cands)
    return problems, no_kernel, reference_findings(case, by_backend, allow_unbounded_reference)
