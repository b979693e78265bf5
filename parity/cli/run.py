"""`parity run`: run cases through the backends in worker processes, write one record per
case and backend, print the table, gate the candidates against the reference when both
ran, and write the HTML report."""

from __future__ import annotations

import sys
from pathlib import Path

from parity.cli import args as check
from parity.cli.common import (
    DEFAULT_BACKENDS,
    UsageError,
    interrupted_status,
    prepare_out,
    run_config,
    run_options,
    select_cases,
    tpu_targets,
    write_report,
)
from parity.execute.backends import check_specs_isolated, fla_compile
from parity.execute.backends.jax_backends import PallasBackend
from parity.execute.runner import run_cases, shard
from parity.execute.tpu_identity import IDENTITIES, choose, exported
from parity.judge.case import deciding_tensor
from parity.judge.gate import GateRefusal, format_summary, run_gate
from parity.judge.words import fmt
from parity.model.host import tpu_attached
from parity.model.options import ALLOW_UNBOUNDED_REFERENCE
from parity.model.verdict import UNJUDGED, Verdict
from parity.records import RecordError


def add_parser(sub) -> None:
    sp = sub.add_parser("run", help="run cases through backends and write per-case reports")
    run_options(sp)
    sp.add_argument("--shard", metavar="I/N", type=check.shard, help="run shard I/N of the cases (1-based)")
    sp.add_argument("--no-html", action="store_true", help="do not write index.html")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    sp.set_defaults(fn=cmd_run)


def cmd_run(a) -> int:
    cases = select_cases(a)
    texts = list(a.backends or default_backends(cases)) + list(a.candidate or [])
    specs = check_specs_isolated(texts, a.timeout)  # SpecError: parity.cli.main writes it with its flag
    if a.shard:
        cases = shard(cases, *a.shard)
    if not cases:
        raise UsageError("no cases selected")
    targets = tpu_targets(a)
    out = prepare_out(a.out or Path(f"reports/{a.suite or 'run'}"))
    # the TPU that interpret mode answers as (None: the workers' default, v5e); a TPU answers for itself
    identity = None if tpu_attached() else choose(a.tpu_interpret_as, targets)
    print(
        f"parity run: {len(cases)} cases x {len(specs)} backends -> {out}"
        + (f"; jax candidates compiled for TPU {','.join(targets)}" if targets else "")
        + (f"; TPU interpret mode answers as {identity[0]} ({IDENTITIES[identity[0]][0]})" if identity else ""),
        file=sys.stderr,
    )
    a.kept = f"the records written so far in {out} (the gate refuses the directory until every case is run)"
    with exported(identity):  # the workers read it (parity.execute.tpu_identity)
        summary = run_cases(cases, run_config(a, out, specs, targets))
    if not summary["interrupted"]:
        a.kept = f"the records of all {len(cases)} cases in {out}, not judged (parity gate {out})"
    gate, rc, gate_text = (None, 0, "") if summary["interrupted"] else judge_run(out, specs, summary, a)
    if gate is not None:
        a.kept = f"the records of all {len(cases)} cases and the gate's verdict in {out}; no page (parity report {out})"
    print_table(summary, gate)
    print_fla_lines(summary)
    if summary["interrupted"]:
        done = len({r["case_id"] for r in summary["results"]})
        print(
            f"parity run: interrupted by {summary['interrupted']}: records for {done} of {len(cases)} cases "
            f"in {out}; the gate refuses this directory until the rest is run",
            file=sys.stderr,
        )
        return interrupted_status(summary["interrupted"])
    if gate_text:
        print(gate_text)
    if not a.no_html:
        try:
            page = write_report([out], out / "index.html")
            if page:
                print(f"report: {page.resolve()}")
        except RecordError as e:
            print(f"report: not written: {e}", file=sys.stderr)
            rc = rc or 2
    return rc


def print_fla_lines(summary: dict) -> None:
    """The run's FLA pre-compile and, with --fla-autotune, the table of what Triton chose."""
    if summary.get("fla_precompile"):
        print(fla_compile.describe(summary["fla_precompile"]))
    tuned = summary.get("fla_tuned_table")
    if tuned:
        print(
            f"FLA configs tuned: {tuned['keys']} keys of {tuned['kernels']} kernels in {tuned['table']} "
            f"(reuse them: --fla-configs {tuned['table']})"
        )


def default_backends(cases) -> list[str]:
    """DEFAULT_BACKENDS less the built-in Pallas kernels that have no kernel for any of the cases
    (named on stderr); a backend asked for with --backends is always run, and judged."""
    specs = DEFAULT_BACKENDS.split(",")
    idle = [s for s in specs if s.startswith("pallas") and not PallasBackend(s).applies_to_any(cases)]
    if idle:
        print(
            f"parity run: not running {', '.join(idle)}: no kernel for any selected case (--backends to run it anyway)",
            file=sys.stderr,
        )
    return [s for s in specs if s not in idle]


def judge_run(out: Path, specs, summary: dict, a) -> tuple[dict | None, int, str]:
    """(the gate's result or None, the exit status, the gate's text) of a finished run: the gate
    where a reference and a candidate ran; else the candidates' and the oracle's records on their
    tolerance alone (the reference's are findings)."""
    if {"reference", "candidate"} <= {s.side for s in specs}:
        try:
            result = run_gate(
                [out],
                a.bound_factor,
                allow_inconclusive=a.allow_inconclusive,
                allow_unbounded_reference=getattr(a, ALLOW_UNBOUNDED_REFERENCE.dest),
            )
        except GateRefusal as e:
            return None, 2, f"gate: refused: {e}"
        return result, 0 if result["ok"] else 1, format_summary(result)
    judged = [r["verdict"] for r in summary["results"] if r["side"] != "reference"]
    return None, 0 if all(v in (Verdict.PASS, Verdict.UNSUPPORTED) for v in judged) else 1, ""


TOLERANCE_ONLY = "(tolerance only)"  # a column whose verdicts are each tensor against its tolerance, no bound


def _cell(r: dict, entry: dict | None) -> str:
    """A table cell: the gate's verdict of the (case, candidate) `entry` with the tensor and rule that
    decided it; without an entry, the record's own verdict and its worst tensor's rel_rms."""
    if entry is not None:
        name = deciding_tensor(entry)
        if entry["verdict"] not in (Verdict.PASS, *UNJUDGED) and name:
            t = entry["tensors"][name]
            return f"{entry['verdict']} {name}={fmt(t['rel_rms'])} ({t['rule']})"
        if entry["verdict"] != Verdict.PASS:
            return entry["verdict"]
    eps, worst = r["worst_rel_rms"], r["worst_tensor"]
    verdict = entry["verdict"] if entry is not None else r["verdict"]
    return verdict + (f" {worst}={fmt(eps)}" if r["side"] != "oracle" and worst and eps is not None else "")


def print_table(summary: dict, gate: dict | None) -> None:
    """One row per case, one column per backend: a candidate's column the gate's verdict (`gate`,
    run_gate's result) for the pair, the others' (and every column without a gate) the records'
    own, marked TOLERANCE_ONLY; no cell is cut. Then the run's timing."""
    rows = summary["results"]
    backends = [b for b in dict.fromkeys(r["backend"] for r in rows)]
    sides = {r["backend"]: r["side"] for r in rows}
    entries = {(e["case_id"], e["candidate"]): e for e in (gate or {}).get("cases", [])}
    by = {(r["case_id"], r["backend"]): r for r in rows}
    ids = sorted({r["case_id"] for r in rows})
    gated = {b for b in backends if sides[b] == "oracle" or (gate and sides[b] == "candidate")}
    heads = {b: b if b in gated else f"{b} {TOLERANCE_ONLY}" for b in backends}
    cells = {(c, b): (_cell(by[c, b], entries.get((c, b))) if (c, b) in by else "-") for c in ids for b in backends}
    width = max([len(i) for i in ids] + [4])
    widths = {b: max([len(heads[b])] + [len(cells[c, b]) for c in ids]) for b in backends}
    print(f"{'case':<{width}}  " + "  ".join(f"{heads[b]:>{widths[b]}}" for b in backends))
    for cid in ids:
        print(f"{cid:<{width}}  " + "  ".join(f"{cells[cid, b]:>{widths[b]}}" for b in backends))
    if gate:
        print(
            "candidates: the gate's verdict of each (case, candidate) and the tensor and rule that decided it; "
            f"{TOLERANCE_ONLY}: each tensor against its tolerance alone"
        )
    t = summary["timing"]
    reused = t.get("reused") or {}
    share = ", ".join(
        f"{b} {s:.1f}s" + (f" ({reused[b]} reused)" if reused.get(b) else "") for b, s in t["per_backend_s"].items()
    )
    overhead = t["harness_overhead_share"]
    print(
        f"{summary['cases']} cases in {summary['wall_time_s']:.1f} s (-j {summary['jobs']}); backend time: {share}; "
        + (f"TPU compile check {t['tpu_compile_s']:.1f} s; " if t.get("tpu_compile_s") else "")
        + f"harness overhead {t['harness_overhead_s']:.1f} s"
        + (f" ({100 * overhead:.1f}% of case time)" if overhead is not None else "")
    )
