"""TPU compile records (kind "compile": a candidate compiled for TPU targets on a CPU host, nothing
executed) as the gate judges and sums them: the lines that make a record fail (`compile_problems`)
and the figures of a run's compiles (`compile_figures`), which the gate's summary
(`compile_summary`, gate.json's "compile" section) and the page's compile section both render."""

from __future__ import annotations

import dataclasses
import statistics

from parity.model.verdict import Verdict


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


@dataclasses.dataclass(frozen=True)
class CompileFigures:
    """What a run's compile records add up to. A pair is one (case, candidate) compile record, a
    compile one target of one pair."""

    pairs: int
    passed: int  # pairs whose verdict is pass
    failed_pairs: int  # pairs with a target that did not compile
    by_target: dict[str, dict[str, int]]  # target -> {"pairs", "ok", "failed", "mismatch"} (mismatch: ok, but
    # its matmuls disagree with the numerics model)
    compiles: int
    seconds: tuple[float, ...]  # the compiles' times, sorted (those that recorded one)
    median_seconds: float | None  # statistics.median(seconds)
    slowest: tuple[float, str, str, str] | None  # (seconds, case_id, backend, target)
    largest_vmem: dict | None  # {"bytes", "kernel", "case", "backend", "target"}: the kernel with the most VMEM
    numerics_errors: int  # compiles whose matmuls could not be checked against the numerics model
    reused: int = 0  # compiles not run: the compile cache's result of the same module (targets[t].reused)


def _records(compiles: dict[str, dict[str, dict]]) -> list[dict]:
    """The compile records, by case id then backend."""
    return [r for cid in sorted(compiles) for _, r in sorted(compiles[cid].items())]


def _largest_vmem(recs: list[dict]) -> dict | None:
    """The kernel with the largest VMEM use over every compile (the first such in record order)."""
    best = None
    for r in recs:
        for target, t in r["targets"].items():
            for kernel, info in (t.get("mosaic") or {}).items():
                b = (info or {}).get("vmem_bytes")
                if isinstance(b, (int, float)) and (best is None or b > best["bytes"]):
                    best = {
                        "bytes": b,
                        "kernel": kernel,
                        "case": r["case_id"],
                        "backend": r["backend"],
                        "target": target,
                    }
    return best


def compile_figures(compiles: dict[str, dict[str, dict]]) -> CompileFigures | None:
    """The figures of case_id -> backend -> compile record; None without records."""
    recs = _records(compiles)
    if not recs:
        return None
    by_target: dict[str, dict[str, int]] = {}
    timed = []  # (seconds, case_id, backend, target)
    for r in recs:
        for target, t in r["targets"].items():
            row = by_target.setdefault(target, {"pairs": 0, "ok": 0, "failed": 0, "mismatch": 0})
            row["pairs"] += 1
            row["ok" if t["ok"] else "failed"] += 1
            row["mismatch"] += bool(t["ok"] and (t.get("numerics") or {}).get("mismatches"))
            if isinstance(t.get("seconds"), (int, float)):
                timed.append((t["seconds"], r["case_id"], r["backend"], target))
    seconds = tuple(sorted(s for s, *_ in timed))
    return CompileFigures(
        pairs=len(recs),
        passed=sum(r["verdict"] == Verdict.PASS for r in recs),
        failed_pairs=sum(any(not t["ok"] for t in r["targets"].values()) for r in recs),
        by_target=by_target,
        compiles=sum(len(r["targets"]) for r in recs),
        seconds=seconds,
        median_seconds=statistics.median(seconds) if seconds else None,
        slowest=max(timed) if timed else None,
        largest_vmem=_largest_vmem(recs),
        numerics_errors=sum(1 for r in recs for t in r["targets"].values() if (t.get("numerics") or {}).get("error")),
        reused=sum(1 for r in recs for t in r["targets"].values() if t.get("reused")),
    )


def compile_summary(compiles: dict[str, dict[str, dict]]) -> dict | None:
    """The compile matrix as gate.json and compile.json hold it: per target ok/failed counts,
    seconds per compile, largest VMEM use; None without records."""
    f = compile_figures(compiles)
    if f is None:
        return None
    vmem = f.largest_vmem if f.largest_vmem and f.largest_vmem["bytes"] > 0 else None
    return {
        "targets": sorted(f.by_target),
        "pairs": f.pairs,
        "ok": f.passed,
        "failed": f.pairs - f.passed,
        "by_target": {t: {"ok": c["ok"], "failed": c["failed"]} for t, c in f.by_target.items()},
        "compiles": f.compiles,
        "reused": f.reused,
        "median_seconds": f.median_seconds,
        "max_seconds": f.slowest[0] if f.slowest else None,
        "max_vmem_bytes": vmem["bytes"] if vmem else 0,
        "max_vmem_where": f"{vmem['case']} [{vmem['backend']}] {vmem['kernel']} on {vmem['target']}" if vmem else None,
    }
