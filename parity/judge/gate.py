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
Reading the directories against their manifests is parity.judge.load's, the text of the
verdict parity.judge.summary's; both are importable from here too (__all__).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from cases import Case
from parity.judge.load import GateRefusal, load, load_checked, load_compiles
from parity.judge.summary import format_compile_summary, format_summary
from parity.measure.compare import bound, bound_localisation
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN
from parity.model.spec import REFERENCE
from parity.records import SCHEMA_VERSION, UNJUDGED, ByCase, tpu_kernel_problem, worst_verdict, write_json

# load, load_compiles, format_summary, format_compile_summary: imported from here by the surfaces
__all__ = [
    "GateRefusal",
    "compared_nothing",
    "compile_problems",
    "compile_summary",
    "evaluate",
    "format_compile_summary",
    "format_summary",
    "load",
    "load_checked",
    "load_compiles",
    "run_gate",
]


def compile_problems(rec: dict) -> list[str]:
    """One line per target that failed, or whose matmuls disagree with the numerics model."""
    out = []
    for target, r in rec["targets"].items():
        if not r["ok"]:
            out.append(
                f"{target} ({r.get('device_kind', '?')}): {r.get('error_line') or r.get('error', '')[:300]}"
                + (f" [at {r['error_op'][:160]}]" if r.get("error_op") else "")
                + (f" [VMEM: {r['vmem']['summary']}]" if r.get("vmem") else "")
            )
        elif r.get("numerics", {}).get("error"):
            out.append(f"{target}: matmuls not checked against the numerics model: {r['numerics']['error'][:300]}")
        else:
            out += [
                f"{target}: numerics model disagrees with the compiled module: {m}"
                for m in r.get("numerics", {}).get("mismatches", [])
            ]
    return out


def compile_summary(compiles: dict[str, dict[str, dict]]) -> dict | None:
    """The compile matrix: per target ok/failed counts, seconds per compile, largest VMEM use."""
    recs = [r for by_backend in compiles.values() for r in by_backend.values()]
    if not recs:
        return None
    by_target: dict[str, dict] = {}
    seconds, vmem = [], (0, None)
    for r in recs:
        for target, t in r["targets"].items():
            row = by_target.setdefault(target, {"ok": 0, "failed": 0})
            row["ok" if t["ok"] else "failed"] += 1
            seconds.append(t.get("seconds") or 0.0)
            for kernel, k in (t.get("mosaic") or {}).items():
                if k.get("vmem_bytes", 0) > vmem[0]:
                    vmem = (k["vmem_bytes"], f"{r['case_id']} [{r['backend']}] {kernel} on {target}")
    seconds.sort()
    return {
        "targets": sorted(by_target),
        "pairs": len(recs),
        "ok": sum(r["verdict"] == "pass" for r in recs),
        "failed": sum(r["verdict"] != "pass" for r in recs),
        "by_target": by_target,
        "compiles": len(seconds),
        "median_seconds": seconds[len(seconds) // 2] if seconds else None,
        "max_seconds": seconds[-1] if seconds else None,
        "max_vmem_bytes": vmem[0],
        "max_vmem_where": vmem[1],
    }


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


def _check_consistent(case_id: str, recs: dict[str, dict]) -> None:
    for field in ("input_hash", "oracle_version", "tol_version"):
        values = {b: r.get(field) for b, r in recs.items()}
        if len(set(values.values())) > 1:
            detail = ", ".join(f"{b}={str(v)[:16]}" for b, v in sorted(values.items()))
            raise GateRefusal(f"case {case_id}: {field} differs between backends ({detail}); refusing to compare")


def evaluate(
    by_case: ByCase,
    factor: float = 1.0,
    reference: str = REFERENCE,
    compiles: dict[str, dict[str, dict]] | None = None,
    allow_mixed_numerics: bool = False,
    allow_inconclusive: bool = False,
) -> dict:
    """The gate's verdict for every case, candidate and tensor (and TPU compile, when
    compile records are given). A tensor whose bound stays undecided over the seeds the records
    hold is `inconclusive`: a failure unless allow_inconclusive (then listed apart)."""
    compiles = compiles or {}
    if not allow_mixed_numerics:
        _check_numerics(by_case)
    cases_out, failures, findings, unsupported, unbounded, not_judged, inconclusive = [], [], [], [], [], [], []
    for case_id in sorted(by_case):
        recs = by_case[case_id]
        _check_consistent(case_id, recs)
        ref = recs.get(reference)
        cands = {b: r for b, r in recs.items() if r["side"] == "candidate"}
        if ref is None:
            raise GateRefusal(f"case {case_id}: no {reference!r} (reference) result in the given directories")
        if not cands:
            raise GateRefusal(f"case {case_id}: no candidate (pallas or --candidate) result in the given directories")
        if ref["status"] != "ok":
            findings.append(
                {
                    "case_id": case_id,
                    "tensor": None,
                    "finding": f"reference {ref['status']}: {(ref.get('error') or '')[:200]}",
                }
            )
        for name, t in ref.get("tensors", {}).items():
            if t.get("verdict") in ("fail-accuracy", "nan-inf"):
                findings.append(
                    {
                        "case_id": case_id,
                        "tensor": name,
                        "finding": f"reference {t['verdict']}",
                        "rel_rms": t.get("rel_rms"),
                        "tol": t.get("tol"),
                    }
                )
        for cname, cand in sorted(cands.items()):
            entry = {
                "case_id": case_id,
                "candidate": cname,
                "reference": reference,
                "candidate_platform": cand.get("platform"),
                "reference_platform": ref.get("platform"),
                "tensors": {},
            }
            if cand["status"] != "ok":
                entry["verdict"] = cand["status"]
                entry["error"] = cand.get("error")
                (unsupported if cand["status"] == "unsupported" else failures).append(
                    {
                        "case_id": case_id,
                        "candidate": cname,
                        "tensor": None,
                        "verdict": cand["status"],
                        "detail": (cand.get("error") or "").splitlines()[0][:200] if cand.get("error") else "",
                    }
                )
                cases_out.append(entry)
                continue
            unseen = [n for n in Case.from_dict(cand["case"]).output_names() if n not in cand["tensors"]]
            compared = [n for n, ct in cand["tensors"].items() if ct["verdict"] not in UNJUDGED]
            if unseen or not compared:
                detail = (
                    f"record has no entry for {', '.join(unseen)}" if unseen else "status ok but no tensor compared"
                )
                entry.update(verdict="error", error=detail)
                failures.append(
                    {"case_id": case_id, "candidate": cname, "tensor": None, "verdict": "error", "detail": detail}
                )
                cases_out.append(entry)
                continue
            for name, ct in cand["tensors"].items():
                rt = ref.get("tensors", {}).get(name)
                t = {
                    "accuracy": ct["verdict"],
                    "rel_rms": ct.get("rel_rms"),
                    "max_abs": ct.get("max_abs"),
                    "tol": ct.get("tol"),
                    "dtype": ct.get("dtype"),
                }
                verdict = ct["verdict"]
                if verdict not in UNJUDGED and rt is not None and "rel_rms" in rt:
                    try:
                        b = bound(ct, rt, factor, *_seed_policy(cand, ref))
                    except ValueError as e:
                        raise GateRefusal(f"case {case_id}, {name}: {e}; refusing to compare") from None
                    t["bound"] = b
                    if verdict == "pass" and not b["ok"]:
                        verdict = b["verdict"]
                else:
                    t["bound"] = None
                    t["bound_note"] = (
                        ("candidate has no such tensor" if verdict == "unsupported" else ct.get("reason", ""))
                        if verdict in UNJUDGED
                        else f"reference has no {name}: {(rt or {}).get('reason', ref['status'])}"
                    )
                t["verdict"] = verdict
                if verdict == "fail-bound":
                    t["localisation"] = bound_localisation(Case.from_dict(cand["case"]), name, ct, rt, factor)
                elif verdict not in ("pass", *UNJUDGED):
                    t["localisation"] = ct.get("localisation", {})
                entry["tensors"][name] = t
                if verdict in UNJUDGED:
                    (unsupported if verdict == "unsupported" else not_judged).append(
                        {
                            "case_id": case_id,
                            "candidate": cname,
                            "tensor": name,
                            "verdict": verdict,
                            "detail": ct.get("reason", ""),
                        }
                    )
                elif verdict == "inconclusive" and allow_inconclusive:
                    inconclusive.append(_failure_line(case_id, cname, name, ct, rt, t, cand))
                elif verdict != "pass":
                    failures.append(_failure_line(case_id, cname, name, ct, rt, t, cand))
            entry["verdict"] = worst_verdict(v["verdict"] for v in entry["tensors"].values())
            problem = tpu_kernel_problem(cand)
            if problem:  # never passed, whatever its tensors
                entry.update(verdict="error", error=problem)
                failures.append(
                    {"case_id": case_id, "candidate": cname, "tensor": None, "verdict": "error", "detail": problem}
                )
            free = [
                n
                for n, v in entry["tensors"].items()
                if v["verdict"] not in UNJUDGED and (not v["bound"] or v["bound"].get("reference_nonfinite"))
            ]
            if free:  # judged on its own tolerance only: the reference gave nothing to bound these by
                unbounded.append(
                    {
                        "case_id": case_id,
                        "candidate": cname,
                        "tensors": free,
                        "reason": entry["tensors"][free[0]].get("bound_note") or f"reference {free[0]} has NaN/Inf",
                    }
                )
            cases_out.append(entry)
    _apply_compiles(compiles, cases_out, failures)
    return {
        "schema": SCHEMA_VERSION,
        "kind": "gate",
        "bound_factor": factor,
        "reference": reference,
        "ok": not failures,
        "cases": cases_out,
        "failures": failures,
        "reference_findings": findings,
        "unsupported": unsupported,
        "not_judged": not_judged,  # backward tensors of forward-only candidates
        "unbounded": unbounded,
        "inconclusive": inconclusive,
        "allow_inconclusive": allow_inconclusive,
        "compile": compile_summary(compiles),
        "counts": {
            v: sum(1 for c in cases_out if c["verdict"] == v) for v in sorted({c["verdict"] for c in cases_out})
        },
    }


def _seed_policy(cand: dict, ref: dict) -> tuple[int, int]:
    """(seeds_min, seeds_max) a verdict needs: what the candidate's run asked for (parity run --seeds;
    SEEDS_MIN, SEEDS_MAX where its record does not say). The reference only supplies figures: a
    reference run with more seeds than that (each side on its own machine) is fine."""
    pol = cand.get("seed_policy") or {"min": SEEDS_MIN, "max": SEEDS_MAX}
    return pol["min"], pol["max"]


def _failure_line(case_id: str, cname: str, name: str, ct: dict, rt: dict | None, t: dict, cand: dict) -> dict:
    """The failures (or inconclusive) list's entry for one tensor: epsilons (rel_rms, the case's own
    seed), compute errors and their ratio with its interval (over the seeds judged)."""
    b = t.get("bound") or {}
    rr = b.get("rel_rms") or {}
    j = b.get("compute") or {}
    return {
        "case_id": case_id,
        "candidate": cname,
        "tensor": name,
        "verdict": t["verdict"],
        "eps_candidate": ct.get("rel_rms"),
        "eps_reference": (rt or {}).get("rel_rms"),
        "c_candidate": j.get("c_candidate"),
        "c_reference": j.get("c_reference"),
        "ratio": rr.get("ratio"),
        "interval": [j.get("lo"), j.get("hi")] if j.get("method") == "ratio" else None,
        "seeds": j.get("seeds"),
        "tol": ct.get("tol"),
        "localisation": t.get("localisation", {}),
        "repro": cand.get("repro"),
    }


def _apply_compiles(compiles: dict, cases_out: list[dict], failures: list[dict]) -> None:
    """Compile verdicts join the case entries (a compile-only case gets an entry of its own)."""
    entries = {(e["case_id"], e["candidate"]): e for e in cases_out}
    for case_id in sorted(compiles):
        for backend, rec in sorted(compiles[case_id].items()):
            entry = entries.get((case_id, backend))
            if entry is None:
                entry = {
                    "case_id": case_id,
                    "candidate": backend,
                    "reference": None,
                    "tensors": {},
                    "verdict": "pass",
                    "candidate_platform": "compile only (no execution)",
                }
                cases_out.append(entry)
            entry["compile"] = {
                t: ("ok" if r["ok"] else r.get("error_line") or "error") for t, r in rec["targets"].items()
            }
            if rec["verdict"] == "pass":
                continue
            entry["verdict"] = worst_verdict([entry["verdict"], rec["verdict"]])
            for line in compile_problems(rec):
                failures.append(
                    {
                        "case_id": case_id,
                        "candidate": backend,
                        "tensor": None,
                        "verdict": rec["verdict"],
                        "detail": line,
                        "repro": rec.get("repro"),
                    }
                )


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
        {
            "case_id": "*",
            "candidate": cand,
            "tensor": None,
            "verdict": "unsupported",
            "detail": f"unsupported everywhere: compared no tensor on any of its {n[cand]} cases",
        }
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
    )
    nothing = compared_nothing(result)
    result["failures"] += nothing
    result["ok"] = result["ok"] and not nothing
    result["coverage"] = coverage
    write_json(Path(out) if out else Path(dirs[0]) / "gate.json", result)
    return result
