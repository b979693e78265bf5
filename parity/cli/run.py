"""`parity run`: run cases through the backends in worker processes, write one record per
case and backend, print the table, gate the candidates against the reference when both
ran, and write the HTML report."""

from __future__ import annotations

import sys
from pathlib import Path

from parity.cli import args as check
from parity.cli.common import (
    UsageError,
    interpret_as_option,
    prepare_out,
    select_cases,
    selection_options,
    tpu_options,
    tpu_targets,
    write_report,
)
from parity.execute.backends import check_specs_isolated
from parity.execute.backends.jax_backends import PallasBackend
from parity.execute.runner import RunConfig, run_cases, shard
from parity.execute.tpu_identity import IDENTITIES, choose, exported
from parity.judge.gate import GateRefusal, format_summary, run_gate
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN
from parity.model.host import tpu_attached
from parity.records import RecordError

DEFAULT_BACKENDS = "oracle,fla,pallas,pallas-fused"


def add_parser(sub) -> None:
    sp = sub.add_parser("run", help="run cases through backends and write per-case reports")
    selection_options(sp, single=True)
    sp.add_argument(
        "--backends",
        type=check.backend_list,
        default=None,
        help=f"comma-separated (default {DEFAULT_BACKENDS}, less the built-in kernels that have "
        "no kernel for any selected case)",
    )
    sp.add_argument(
        "--candidate", action="append", help="NAME=FRAMEWORK:MODULE:FUNCTION, FRAMEWORK jax or torch (repeatable)"
    )
    sp.add_argument("--out", type=check.output_dir, help="output directory (default reports/<suite>)")
    sp.add_argument("-j", "--jobs", type=check.positive_int, default=1, help="parallel worker processes")
    sp.add_argument("--shard", type=check.shard, help="run shard I/N of the cases (1-based)")
    sp.add_argument(
        "--timeout",
        type=check.seconds,
        default=900.0,
        help="seconds a worker may spend on one backend of a case (its import included) before it is killed",
    )
    sp.add_argument(
        "--bound-factor",
        type=check.bound_factor,
        default=1.0,
        help="compute error of the candidate <= F x the reference's (parity.measure.compute_error)",
    )
    sp.add_argument(
        "--seeds",
        type=check.seeds,
        default=(SEEDS_MIN, SEEDS_MAX),
        help=f"input seeds per case, MIN:MAX (default {SEEDS_MIN}:{SEEDS_MAX}): the case's own seed, then seeds "
        "derived from it while the bound is undecided (fewer than MIN only when far from the bound)",
    )
    sp.add_argument(
        "--allow-inconclusive",
        action="store_true",
        help="the run's own gate passes a tensor whose bound stays undecided at MAX seeds (listed apart)",
    )
    sp.add_argument("--no-html", action="store_true", help="do not write index.html")
    sp.add_argument("--no-progress", action="store_true")
    tpu_options(sp)
    interpret_as_option(sp)
    sp.add_argument(
        "--tpu-numerics",
        default="",
        choices=["", "tpu-mxu-v1", "float32"],
        help="how jax candidates' dots compute off a TPU: tpu-mxu-v1 (default: as the TPU's MXU) "
        "or float32 (interpret mode's own, for comparison)",
    )
    sp.set_defaults(fn=cmd_run)


def cmd_run(a) -> int:
    cases = select_cases(a)
    texts = list(a.backends or _default_backends(cases)) + list(a.candidate or [])
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
    with exported(identity):  # the workers read it (parity.execute.tpu_identity)
        summary = run_cases(
            cases,
            RunConfig(
                out_dir=out,
                backends=specs,
                jobs=a.jobs,
                timeout_s=a.timeout,
                progress=not a.no_progress,
                tpu_targets=targets,
                numerics=a.tpu_numerics,
                seeds=a.seeds,
            ),
        )
    _print_table(summary)
    if summary["interrupted"]:
        done = len({r["case_id"] for r in summary["results"]})
        print(
            f"parity run: interrupted by {summary['interrupted']}: records for {done} of {len(cases)} cases "
            f"in {out}; the gate refuses this directory until the rest is run",
            file=sys.stderr,
        )
        return 130 if summary["interrupted"] == "SIGINT" else 143
    if {"reference", "candidate"} <= {s.side for s in specs}:
        try:
            result = run_gate([out], a.bound_factor, allow_inconclusive=a.allow_inconclusive)
            print(format_summary(result))
            rc = 0 if result["ok"] else 1
        except GateRefusal as e:
            print(f"gate: refused: {e}")
            rc = 2
    else:  # no gate: the candidates' records on their tolerance, and the oracle (the reference's are findings)
        rc = (
            0
            if all(r["verdict"] in ("pass", "unsupported") for r in summary["results"] if r["side"] != "reference")
            else 1
        )
    if not a.no_html:
        try:
            page = write_report([out], out / "index.html")
            if page:
                print(f"report: {page.resolve()}")
        except RecordError as e:
            print(f"report: not written: {e}", file=sys.stderr)
            rc = rc or 2
    return rc


def _default_backends(cases) -> list[str]:
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


def _print_table(summary: dict) -> None:
    rows = summary["results"]
    backends = [b for b in dict.fromkeys(r["backend"] for r in rows)]
    by = {(r["case_id"], r["backend"]): r for r in rows}
    ids = sorted({r["case_id"] for r in rows})
    width = max([len(i) for i in ids] + [4])
    print(f"{'case':<{width}}  " + "  ".join(f"{b:>24}" for b in backends))
    for cid in ids:
        cells = []
        for b in backends:
            r = by.get((cid, b))
            if r is None:
                cells.append(f"{'-':>24}")
                continue
            eps = r["worst_rel_rms"]
            detail = (
                ""
                if b == "oracle"
                else (f" {r['worst_tensor']}={eps:.1e}" if eps is not None and r["worst_tensor"] else "")
            )
            cells.append(f"{(r['verdict'] + detail)[:24]:>24}")
        print(f"{cid:<{width}}  " + "  ".join(cells))
    t = summary["timing"]
    share = ", ".join(f"{b} {s:.1f}s" for b, s in t["per_backend_s"].items())
    overhead = t["harness_overhead_share"]
    print(
        f"{summary['cases']} cases in {summary['wall_time_s']:.1f} s (-j {summary['jobs']}); backend time: {share}; "
        + (f"TPU compile check {t['tpu_compile_s']:.1f} s; " if t.get("tpu_compile_s") else "")
        + f"harness overhead {t['harness_overhead_s']:.1f} s"
        + (f" ({100 * overhead:.1f}% of case time)" if overhead is not None else "")
    )
