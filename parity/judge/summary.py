"""The gate's verdict as text: one line per failure, reference finding and unenforced bound (one
per cause of the reference's environment, with its fix), the references from the interpreter
fallback, the smallest margin to the bound, the TPU compile matrix, what was not seen, and PASS
or FAIL."""

from __future__ import annotations

from parity.judge.words import describe_localisation, fmt


def _interval(f: dict) -> str:
    """' [lo, hi] over n seeds (compute error c vs c)' of a compute-error ratio, when the failure has one."""
    iv = f.get("interval")
    if not iv or iv[0] is None:
        return ""
    return (
        f" [{fmt(iv[0])}, {fmt(iv[1])}] over {f['seeds']} seed(s) (compute error {fmt(f.get('c_candidate'))}"
        f" vs {fmt(f.get('c_reference'))})"
    )


def format_summary(result: dict) -> str:
    lines = [
        f"gate: {len(result['cases'])} case/candidate pairs, bound factor {result['bound_factor']}: "
        + ", ".join(f"{n} {v}" for v, n in result["counts"].items())
    ]
    lines += [failure_lines(f) for f in result["failures"]]
    for f in result.get("inconclusive", []):
        lines.append(
            f"  INCONCLUSIVE (allowed) {f['case_id']} [{f['candidate']}] {f['tensor']}: "
            + (f"decided by {f['why']}" if f.get("why") else f"compute error ratio={fmt(f['ratio'])}{_interval(f)}")
        )
    for f in result["reference_findings"]:
        lines.append(
            f"  REFERENCE {f['case_id']} {f['tensor'] or ''}: {f['finding']}"
            + (f" eps={fmt(f.get('rel_rms'))} tol={fmt(f.get('tol'))}" if f.get("tensor") else "")
        )
    if result["unsupported"]:
        lines.append(
            f"  unsupported: {len(result['unsupported'])} (case, candidate, tensor) entries, e.g. "
            + "; ".join(
                f"{u['case_id']} [{u['candidate']}] {u['tensor'] or ''} {u['detail'][:80]}"
                for u in result["unsupported"][:3]
            )
        )
    if result.get("not_judged"):
        n = result["not_judged"]
        pairs = sorted({(x["case_id"], x["candidate"]) for x in n})
        lines.append(
            f"  not judged (forward-only candidates, backward not run): {len(n)} tensors of {len(pairs)} "
            "case/candidate pairs, e.g. " + "; ".join(f"{c} [{b}]" for c, b in pairs[:3])
        )
    if result.get("unbounded"):
        u = result["unbounded"]
        lines.append(
            "  bound not enforced (no reference tensor, or one with NaN/Inf; tolerance only): "
            f"{len(u)} case/candidate pairs, "
            f"{sum(len(x['tensors']) for x in u)} tensors, e.g. {u[0]['case_id']} [{u[0]['candidate']}] "
            f"{', '.join(u[0]['tensors'])}: {u[0]['reason'][:100]}"
        )
    lines += environment_lines(result.get("unbounded_by_environment") or [])
    lines += [
        f"  UNBOUNDED-REFERENCE (allowed) {u['case_id']} [{u['candidate']}] {', '.join(u['failing'])}: {u['issue']}"
        for u in result.get("unbounded_by_environment") or []
        if u.get("allowed") and u["failing"]
    ]
    fallbacks = result.get("reference_fallbacks") or []
    if fallbacks:
        f = fallbacks[0]
        lines.append(
            f"  references from the interpreter fallback (FLA recomputed in the Triton interpreter after CUDA "
            f"refused; bounded as any reference): {len(fallbacks)} cases, e.g. {f['case_id']} "
            f"(from {f['from']}, {f['issue'] or 'refusal not named'})"
        )
    if result.get("compile"):
        lines.append(format_compile_summary(result["compile"]))
    cov = result.get("coverage") or {}
    if cov.get("partial"):
        lines.append(
            f"  PARTIAL (--allow-partial): {len(cov['missing'])} listed records missing, {len(cov['skipped'])} "
            f"unreadable or malformed files skipped, {len(cov['no_manifest'])} directories without a manifest"
            + "".join(f"\n    not seen: {x}" for x in (cov["missing"] + cov["skipped"])[:5])
        )
    if cov.get("ignored"):
        lines.append(f"  ignored: {cov['ignored']} records that no manifest lists")
    m = smallest_margin(result["cases"])
    if m:
        lines.append(f"  {margin_line(m)}")
    lines.append("gate: PASS" if result["ok"] else f"gate: FAIL ({len(result['failures'])} failures)")
    return "\n".join(lines)


def environment_lines(unbounded_by_environment: list[dict]) -> list[str]:
    """One line per issue of the reference's environment that left candidates unbounded (gate.json's
    "unbounded_by_environment"): how many pairs and tensors, the cause, the fix, and whether the gate
    failed them (unbounded-reference) or --allow-unbounded-reference let them pass."""
    by_issue: dict[str, list[dict]] = {}
    for u in unbounded_by_environment:
        by_issue.setdefault(u["issue"], []).append(u)
    lines = []
    for issue, us in by_issue.items():
        failing = sum(len(u["failing"]) for u in us)
        verdict = (
            "none within tolerance"
            if not failing
            else f"{failing} passed as allowed (--allow-unbounded-reference)"
            if all(u.get("allowed") for u in us)
            else f"{failing} failing as unbounded-reference (--allow-unbounded-reference passes them)"
        )
        lines.append(
            f"  bound not enforced, the reference's environment: {len({(u['case_id'], u['candidate']) for u in us})} "
            f"case/candidate pairs, {sum(len(u['tensors']) for u in us)} tensors ({verdict}): {issue} "
            f"{us[0]['cause']}: fix: {us[0]['fix']}"
        )
    return lines


def failure_lines(f: dict) -> str:
    """A gate failure (Failure.as_dict) as text: 'FAIL CASE [candidate] tensor: verdict, decided by
    RULE: its figures', the epsilons and tolerance, where the error is, and the command that
    reproduces it."""
    head = f"  FAIL {f['case_id']} [{f['candidate']}]"
    if f["tensor"] is None:
        return f"{head} {f['verdict']}: {f['detail']}" + (f"\n       repro: {f['repro']}" if f.get("repro") else "")
    figures = f"eps_candidate={fmt(f['eps_candidate'])} eps_reference={fmt(f['eps_reference'])} tol={fmt(f['tol'])}"
    if not f.get("why"):  # a failure without its rule: the ratio and its interval
        figures += f" ratio={fmt(f['ratio'])}{_interval(f)}"
    return (
        f"{head} {f['tensor']}: {f['verdict']}"
        + (f", decided by {f['why']}" if f.get("why") else "")
        + f"\n       {figures}"
        + (f"\n       at: {describe_localisation(f['localisation'])}" if f.get("localisation") else "")
        + (f"\n       repro: {f['repro']}" if f.get("repro") else "")
    )


def margin_of(j: dict) -> tuple[str, float] | None:
    """(what, value) of a compute-error judgement (compute_error.judge): hi / factor for the ratio;
    for the rounding bound the nearer of its two limits, eps_candidate / limit and c_candidate /
    compute_limit; above 1 is over the bound."""
    if j.get("method") == "ratio" and j.get("hi") is not None and j["factor"] > 0:
        return "hi/factor", j["hi"] / j["factor"]
    if j.get("method") != "rounding":
        return None
    margins = []
    if j.get("limit"):
        margins.append(("eps/limit", j["eps_candidate"] / j["limit"]))
    if j.get("compute_limit"):
        margins.append(("c/limit", j["c_candidate"] / j["compute_limit"]))
    return max(margins, key=lambda m: m[1]) if margins else None


def smallest_margin(cases: list[dict]) -> dict | None:
    """The bounded tensor of the gate's case entries whose margin_of is largest (closest to, or
    furthest over, the bound): {case_id, candidate, tensor, what, value, seeds}, or None."""
    best = None
    for c in cases:
        for name, t in (c.get("tensors") or {}).items():
            j = (t.get("bound") or {}).get("compute") or {}
            m = margin_of(j)
            if m and (best is None or m[1] > best["value"]):
                best = {"case_id": c["case_id"], "candidate": c["candidate"], "tensor": name, "what": m[0]}
                best.update(value=m[1], seeds=j["seeds"])
    return best


def margin_line(m: dict) -> str:
    """'smallest margin: hi/factor = 0.93 at CASE [candidate] tensor (3 seeds)'."""
    return (
        f"smallest margin: {m['what']} = {m['value']:.3g} at {m['case_id']} [{m['candidate']}] {m['tensor']} "
        f"({m['seeds']} seed(s))"
    )


def _seconds(x) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def format_compile_summary(c: dict) -> str:
    """The compile summary (parity.judge.compiles.compile_summary) in one line."""
    per = ", ".join(f"{t} {v['ok']} ok/{v['failed']} failed" for t, v in sorted(c["by_target"].items()))
    vmem = f"{c['max_vmem_bytes'] / 2**20:.2f} MiB ({c['max_vmem_where']})" if c.get("max_vmem_where") else "n/a"
    return (
        f"  TPU compile (on this host, nothing executed): {c['pairs']} case/candidate pairs, {c['ok']} ok, "
        f"{c['failed']} failed; {per}; {c['compiles']} compiles"
        + (f" ({c['reused']} reused from the compile cache)" if c.get("reused") else "")
        + f", median {_seconds(c['median_seconds'])}, "
        f"max {_seconds(c['max_seconds'])}; largest kernel VMEM operands {vmem}"
    )
