"""`parity diff BASE NEW`: how each tensor's error moved between two runs of the same cases.

For every (case, backend) in both runs (matched by case id; both records must hold the same
input hash, else the diff is refused) and every tensor both compared against the oracle:
ratio = eps_new / eps_base on rel_rms. A tensor is flagged when its ratio exceeds `max_ratio`
(default 1.25) or its verdict gets worse (parity.model.verdict.Verdict, declared worst first;
NaN/Inf where there was none included). A kernel change that triples an error while staying
inside tolerance is flagged here though every gate still passes. Refused (DiffRefusal, exit 2): a directory
that cannot be read, a malformed record, mismatched input hashes, a (case, backend) of BASE
missing from NEW (what the diff did not see is never a pass), nothing in common.
The oracle's records carry no error and are not compared.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from parity.model.verdict import Verdict
from parity.records import RecordError, load_latest

DEFAULT_MAX_RATIO = 1.25


class DiffRefusal(Exception):
    """The two runs cannot be compared; the message says why."""


def _ratio(base: float | None, new: float | None) -> float | None:
    """eps_new / eps_base; None when either is missing (NaN/Inf); inf when only base is 0."""
    if base is None or new is None:
        return None
    if base == 0:
        return 1.0 if new == 0 else math.inf
    return new / base


def _worse(base: str, new: str) -> bool:
    rank = {v: i for i, v in enumerate(Verdict)}
    return rank.get(new, 0) < rank.get(base, 0)


def diff_runs(base_dirs: list[Path], new_dirs: list[Path], max_ratio: float = DEFAULT_MAX_RATIO) -> dict:
    """{"rows": one per (case, backend, tensor), worst ratio first, "flagged": the rows that grew
    or got worse, "only_new": (case, backend)s without a baseline, "max_ratio", "ok"}."""
    if not (isinstance(max_ratio, (int, float)) and math.isfinite(max_ratio) and max_ratio >= 1):
        raise DiffRefusal(f"--max-ratio {max_ratio!r} is invalid: expected a finite number >= 1")
    try:
        base, new = load_latest(base_dirs), load_latest(new_dirs)
    except RecordError as e:
        raise DiffRefusal(str(e)) from None
    pairs = {(c, b) for c, recs in base.items() for b, r in recs.items() if r["side"] != "oracle"}
    new_pairs = {(c, b) for c, recs in new.items() for b, r in recs.items() if r["side"] != "oracle"}
    missing = sorted(pairs - new_pairs)
    if missing:
        raise DiffRefusal(
            f"{len(missing)} (case, backend) of BASE not in NEW, e.g. "
            + "; ".join(f"{c} [{b}]" for c, b in missing[:3])
        )
    if not pairs:
        raise DiffRefusal(f"no case and backend (other than the oracle) in BASE {', '.join(map(str, base_dirs))}")
    rows = []
    for case_id, backend in sorted(pairs):
        rb, rn = base[case_id][backend], new[case_id][backend]
        if rb.get("input_hash") != rn.get("input_hash"):
            raise DiffRefusal(
                f"case {case_id} [{backend}]: input_hash differs (BASE {str(rb.get('input_hash'))[:16]}, "
                f"NEW {str(rn.get('input_hash'))[:16]}): not the same inputs, refusing to compare"
            )
        if rb["status"] != "ok" or rn["status"] != "ok":
            rows.append(_row(case_id, backend, None, rb["verdict"], rn["verdict"], None, None, max_ratio))
            continue
        for tensor in sorted(set(rb["tensors"]) | set(rn["tensors"])):
            tb, tn = rb["tensors"].get(tensor, {}), rn["tensors"].get(tensor, {})
            rows.append(
                _row(
                    case_id,
                    backend,
                    tensor,
                    tb.get("verdict", Verdict.UNSUPPORTED),
                    tn.get("verdict", Verdict.UNSUPPORTED),
                    tb.get("rel_rms"),
                    tn.get("rel_rms"),
                    max_ratio,
                )
            )
    rows.sort(key=lambda r: (not r["flagged"], -(r["ratio"] if r["ratio"] is not None else math.inf)))
    flagged = [r for r in rows if r["flagged"]]
    only_new = sorted(f"{c} [{b}]" for c, b in new_pairs - pairs)
    return {
        "kind": "diff",
        "base": [str(d) for d in base_dirs],
        "new": [str(d) for d in new_dirs],
        "max_ratio": max_ratio,
        "rows": rows,
        "flagged": flagged,
        "only_new": only_new,
        "ok": not flagged,
    }


def _row(case_id, backend, tensor, v_base, v_new, e_base, e_new, max_ratio) -> dict:
    ratio = _ratio(e_base, e_new)
    why = []
    if _worse(v_base, v_new):
        why.append(f"verdict {v_base} -> {v_new}")
    if ratio is not None and ratio > max_ratio:
        why.append(f"error x{ratio:.3g} > {max_ratio:g}")
    return {
        "case_id": case_id,
        "backend": backend,
        "tensor": tensor,
        "verdict_base": v_base,
        "verdict_new": v_new,
        "eps_base": e_base,
        "eps_new": e_new,
        "ratio": ratio,
        "flagged": bool(why),
        "why": "; ".join(why),
    }


def ratio_summary(rows: list[dict]) -> dict | None:
    """{"n", "median", "min", "max"} of the rows' finite ratios eps_new / eps_base (the terminal
    and the diff page print these); None when no row has one."""
    finite = sorted(r["ratio"] for r in rows if r["ratio"] is not None and math.isfinite(r["ratio"]))
    if not finite:
        return None
    return {"n": len(finite), "median": statistics.median(finite), "min": finite[0], "max": finite[-1]}


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def format_diff(result: dict, verbose: bool = False) -> str:
    """The flagged rows (every row with verbose), then one summary line."""
    shown = result["rows"] if verbose else result["flagged"]
    lines = [f"{'case':60s} {'backend':14s} {'tensor':8s} {'eps_base':>9s} {'eps_new':>9s} {'ratio':>7s}  verdict"]
    for r in shown:
        verdict = (
            r["verdict_new"] if r["verdict_new"] == r["verdict_base"] else f"{r['verdict_base']} -> {r['verdict_new']}"
        )
        lines.append(
            f"{r['case_id']:60s} {r['backend']:14s} {r['tensor'] or '-':8s} {_fmt(r['eps_base']):>9s} "
            f"{_fmt(r['eps_new']):>9s} {_fmt(r['ratio']):>7s}  {verdict}" + ("   FLAGGED" if r["flagged"] else "")
        )
    ratios = ratio_summary(result["rows"])
    if ratios:
        lines.append(
            f"{len(result['rows'])} tensors compared: ratio eps_new / eps_base median {ratios['median']:.3g}, "
            f"min {ratios['min']:.3g}, max {ratios['max']:.3g}"
        )
    if result["only_new"]:
        lines.append(
            f"{len(result['only_new'])} (case, backend) only in NEW (no baseline), e.g. {result['only_new'][0]}"
        )
    lines.append(
        "diff: PASS"
        if result["ok"]
        else f"diff: FAIL ({len(result['flagged'])} tensors grew by more than x{result['max_ratio']:g} "
        "or got a worse verdict)"
    )
    return "\n".join(lines)
