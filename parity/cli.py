"""The `parity` command line.

    parity cases     --suite NAME | --cases FILE [--op OP] [--json]
    parity run       --suite NAME | --cases FILE | --case ID ... [--op OP] [--backends oracle,fla,pallas]
                     [--candidate NAME=FRAMEWORK:MODULE:FUNCTION ...] [--out DIR] [-j N] [--shard I/N]
                     [--timeout S] [--bound-factor F] [--no-html]
    parity compile   --suite NAME | --cases FILE | --case ID ... [--op OP] [--backends pallas,pallas-fused]
                     [--candidate SPEC ...] [--tpu-targets v5e,v6e,tpu7x] [--out DIR] [-j N]
    parity gate      DIR [DIR ...] [--bound-factor F] [--out FILE] [--allow-mixed-numerics]
    parity calibrate DIR [DIR ...] [--write]
    parity mutants   [--suite ci] [--only NAME] [--out DIR] [-j N] [--list]
    parity report    DIR [DIR ...] -o FILE.html
    parity repro     CASE_ID [--backend pallas | --candidate SPEC] -o DIR
    parity diff      BASE NEW [--max-ratio 1.25] [-o PAGE.html] [-v]
    parity fuzz      [--op OP] [--backends oracle[,fla]] [--candidate SPEC] [--time S] [--seed N] [-j N]
                     [--max-examples N] [--timeout S] [--max-elements N] [--out DIR]

Exit codes, the same for every command: 0 pass, 1 a parity failure (a failing gate; for
`parity run` without a reference and a candidate to gate, an oracle or candidate record
that is not a pass), 2 refused input, 3 an internal error of the harness; 130 / 143 when
SIGINT / SIGTERM ended a run (what finished is kept and summarised).
Refused input (unknown suite, op, backend, bad candidate spec or module, a case field of
the wrong type, a case over the size limit, a bad -j / --timeout / --bound-factor /
--shard / --backends / --out, an unreadable or malformed record) -> one line on stderr
naming the field and the allowed values, exit 2, before any case runs. An internal error
-> its traceback in a log file and one line pointing at it, exit 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from cases import OPS, Case, CaseError, check_size, get_suite, load_cases_file
from cases.inputs import MAX_INPUT_BYTES, MAX_INPUT_ELEMENTS

from . import args as check

DEFAULT_BACKENDS = "oracle,fla,pallas,pallas-fused"
TPU_TARGETS = ("v4", "v5e", "v5p", "v6e", "tpu7x")  # parity.tpu_compile.TARGETS (kept import-free)


class UsageError(Exception):
    """One line for stderr, exit 2."""


def _select_cases(a) -> list[Case]:
    sources = sum(bool(x) for x in (a.suite, getattr(a, "cases", None), getattr(a, "case", None)))
    if sources != 1:
        raise UsageError(
            "give exactly one of --suite NAME, --cases FILE" + (", --case ID" if hasattr(a, "case") else "")
        )
    try:
        if a.suite:
            cases = get_suite(a.suite)
        elif a.cases:
            cases = load_cases_file(a.cases)
        else:
            cases = [Case.from_id(i) for i in a.case]
    except CaseError as e:
        raise UsageError(str(e)) from None
    if a.op:
        if a.op not in OPS:
            raise UsageError(f"unknown op {a.op!r}: expected one of {list(OPS)}")
        cases = [c for c in cases if c.op == a.op]
    for c in cases:
        check_size(c, a.max_elements, a.max_bytes)
    return cases


def cmd_cases(a) -> int:
    from cases.models import label

    cases = _select_cases(a)
    labels = [label(c) for c in cases]
    if a.json:
        print(
            json.dumps(
                [{"id": c.id, **c.to_dict(), **({"label": n} if n else {})} for c, n in zip(cases, labels)], indent=1
            )
        )
    else:
        for c, n in zip(cases, labels):
            print(c.id + (f"    # {n}" if n else ""))
        print(f"{len(cases)} cases", file=sys.stderr)
    return 0


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


def _prepare_out(out: Path) -> Path:
    """Create the output directory and prove it writable, before any worker starts."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as e:
        raise UsageError(f"--out {str(out)!r}: cannot write there: {e.strerror or e}") from None
    return out


def cmd_run(a) -> int:
    from .backends import SpecError, check_specs_isolated
    from .records import RecordError
    from .runner import RunConfig, run_cases, shard

    cases = _select_cases(a)
    texts = list(a.backends or _default_backends(cases)) + list(a.candidate or [])
    try:
        specs = check_specs_isolated(texts, a.timeout)
    except SpecError as e:
        raise UsageError(str(e)) from None
    if a.shard:
        cases = shard(cases, *a.shard)
    if not cases:
        raise UsageError("no cases selected")
    targets = _targets(a)
    out = _prepare_out(a.out or Path(f"reports/{a.suite or 'run'}"))
    print(
        f"parity run: {len(cases)} cases x {len(specs)} backends -> {out}"
        + (f"; jax candidates compiled for TPU {','.join(targets)}" if targets else ""),
        file=sys.stderr,
    )
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
        from .gate import GateRefusal, format_summary, run_gate

        try:
            result = run_gate([out], a.bound_factor)
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
            page = _write_report([out], out / "index.html")
            if page:
                print(f"report: {page.resolve()}")
        except RecordError as e:
            print(f"report: not written: {e}", file=sys.stderr)
            rc = rc or 2
    return rc


def _default_backends(cases) -> list[str]:
    """DEFAULT_BACKENDS less the built-in Pallas kernels that have no kernel for any of the cases
    (named on stderr); a backend asked for with --backends is always run, and judged."""
    from .backends.jax_backends import PallasBackend

    specs = DEFAULT_BACKENDS.split(",")
    idle = [s for s in specs if s.startswith("pallas") and not PallasBackend(s).applies_to_any(cases)]
    if idle:
        print(
            f"parity run: not running {', '.join(idle)}: no kernel for any selected case (--backends to run it anyway)",
            file=sys.stderr,
        )
    return [s for s in specs if s not in idle]


def _targets(a) -> tuple[str, ...]:
    from .tpu_compile import parse_targets

    try:
        return parse_targets(a.tpu_targets)
    except ValueError as e:
        raise UsageError(str(e)) from None


def cmd_compile(a) -> int:
    from .backends import SpecError, check_specs
    from .tpu_compile import compile_suite, format_compile_table

    cases = _select_cases(a)
    texts = list(a.backends) + list(a.candidate or [])
    try:
        parsed = check_specs(texts)
    except SpecError as e:
        raise UsageError(str(e)) from None
    bad = [s.text for s in parsed if s.side != "candidate" or s.framework == "torch"]
    specs = [s.text for s in parsed]
    if bad:
        raise UsageError(
            f"--backends {bad[0]!r}: parity compile compiles jax candidates for TPU "
            "(pallas, pallas-fused, mutant:NAME, --candidate NAME=jax|pallas:...)"
        )
    if a.tpu_targets is None:
        a.tpu_targets = "v5e,v6e,tpu7x"
    targets = _targets(a)
    if not targets or not cases:
        raise UsageError("nothing to compile: give --tpu-targets and at least one case")
    out = _prepare_out(a.out or Path(f"reports/compile-{a.suite or 'run'}"))
    print(
        f"parity compile: {len(cases)} cases x {len(specs)} candidates x {len(targets)} TPU targets -> {out} "
        "(compiled on this host for TPU; nothing executes)",
        file=sys.stderr,
    )
    records = compile_suite(cases, specs, targets, out, jobs=a.jobs)
    print(format_compile_table(records, verbose=a.verbose))
    from .gate import compile_summary, format_compile_summary
    from .records import write_json

    by_case: dict = {}
    for r in records:
        by_case.setdefault(r["case_id"], {})[r["backend"]] = r
    summary = compile_summary(by_case)
    if summary:
        print(format_compile_summary(summary))
        write_json(out / "compile.json", {"kind": "compile-summary", **summary})
    failed = [r for r in records if r["verdict"] != "pass"]
    print("compile: PASS" if not failed else f"compile: FAIL ({len(failed)} case/candidate pairs)")
    return 1 if failed else 0


def cmd_mutants(a) -> int:
    from .mutants import BY_NAME, catalogue_json
    from .mutants.run import format_score, run_mutants

    if a.list:
        print(catalogue_json())
        return 0
    for n in a.only or []:
        if n not in BY_NAME:
            raise UsageError(f"--only {n!r}: expected one of {sorted(BY_NAME)}")
    if not (a.suite or a.cases or a.case):
        a.suite = "ci"
    cases = _select_cases(a)
    if not cases:
        raise UsageError("no cases selected")
    out = Path(a.out)
    print(f"parity mutants: {len(cases)} cases -> {out}", file=sys.stderr)
    result = run_mutants(
        cases,
        out,
        jobs=a.jobs,
        timeout_s=a.timeout,
        factor=a.bound_factor,
        names=a.only,
        progress=not a.no_progress,
        tpu_targets=_targets(a),
    )
    print(format_score(result))
    if not a.no_html:
        page = _write_report([out], out / "index.html")
        if page:
            print(f"report: {page.resolve()}")
    return 0 if result["caught"] == result["total"] and not result["unmutated_failures"] else 1


def cmd_fuzz(a) -> int:
    from .backends import BUILTIN, SpecError, check_specs_isolated
    from .fuzz import FuzzConfig, applies_predicate, format_summary, read_found, run_fuzz, space_for

    backends = list(a.backends)
    extra = [s for s in backends if s not in ("oracle", "fla")]
    if extra:
        raise UsageError(
            f"--backends {extra[0]!r}: parity fuzz takes oracle and fla here; give the kernel to "
            "search with --candidate (pallas, pallas-fused, mutant:NAME or NAME=FRAMEWORK:MODULE:FUNCTION)"
        )
    if a.candidate in ("oracle", "fla"):
        raise UsageError(
            f"--candidate {a.candidate!r}: expected pallas, pallas-fused, mutant:NAME or "
            "NAME=FRAMEWORK:MODULE:FUNCTION (FLA itself is searched with no --candidate and --backends oracle,fla)"
        )
    if not a.candidate and "fla" not in backends:
        raise UsageError(
            "--candidate: nothing to search: give --candidate SPEC, or --backends oracle,fla to search FLA itself"
        )
    if a.candidate and a.candidate not in BUILTIN and "=" not in a.candidate and not a.candidate.startswith("mutant:"):
        raise UsageError(
            f"--candidate {a.candidate!r}: expected pallas, pallas-fused, mutant:NAME or NAME=FRAMEWORK:MODULE:FUNCTION"
        )
    specs = ["oracle"] + [s for s in backends if s != "oracle"] + ([a.candidate] if a.candidate else [])
    try:
        check_specs_isolated(specs, a.timeout)
    except SpecError as e:
        raise UsageError(str(e)) from None
    ops = [o.strip() for o in a.op.split(",")] if a.op else list(OPS)
    for op in ops:
        if op not in OPS:
            raise UsageError(f"--op {op!r}: expected one of {list(OPS)} (comma-separated)")
    applies = applies_predicate(a.candidate) if a.candidate else None
    usable = []
    for op in ops:
        try:
            space_for(op, applies, a.max_elements)
            usable.append(op)
        except ValueError as e:
            if a.op:
                raise UsageError(f"--op {op!r}: {e}") from None
    out = _prepare_out(a.out)
    try:
        read_found(out / "found.json")
    except ValueError as e:
        raise UsageError(f"--out: {e}") from None
    cfg = FuzzConfig(
        out=out,
        ops=tuple(usable),
        backends=tuple(backends),
        candidate=a.candidate,
        time_s=a.time,
        shrink_time_s=a.shrink_time,
        max_examples=a.max_examples,
        seed=a.seed,
        jobs=a.jobs,
        timeout_s=a.timeout,
        max_elements=a.max_elements,
        factor=a.bound_factor,
        progress=not a.no_progress,
        numerics=a.tpu_numerics,
    )
    print(
        f"parity fuzz: {', '.join(usable)} x {a.jobs} search(es) of {a.time:g} s, searching "
        + (f"candidate {a.candidate}" if a.candidate else "fla (the reference) against the oracle")
        + f" with backends {','.join(specs)} -> {out}",
        file=sys.stderr,
    )
    summary = run_fuzz(cfg)
    if summary.get("page"):
        print(f"report: {Path(summary['page']).resolve()}", file=sys.stderr)
    print(format_summary(summary))
    return 1 if summary["found"] else 0


def _seed(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s!r} is invalid: expected an int >= 0")
    return v


def _write_report(dirs: list[Path], out: Path) -> Path | None:
    try:
        from .html import write_report
    except ImportError:
        return None
    return write_report(dirs, out)


def cmd_gate(a) -> int:
    from .gate import GateRefusal, format_summary, run_gate

    try:
        result = run_gate(
            [Path(d) for d in a.dirs],
            a.bound_factor,
            Path(a.out) if a.out else None,
            allow_partial=a.allow_partial,
            allow_mixed_numerics=a.allow_mixed_numerics,
        )
    except GateRefusal as e:
        print(f"parity gate: refused: {e}", file=sys.stderr)
        return 2
    print(format_summary(result))
    return 0 if result["ok"] else 1


def cmd_calibrate(a) -> int:
    from .records import iter_results
    from .tol import TOL_FILE, calibrate

    samples = []
    for _, rec in iter_results([Path(d) for d in a.dirs]):
        if rec["side"] != "reference" or rec["status"] != "ok":
            continue
        case = Case.from_dict(rec["case"])
        samples += [(case, n, t.get("rel_rms")) for n, t in rec["tensors"].items() if "rel_rms" in t]
    if not samples:
        print("parity calibrate: no reference-side results found", file=sys.stderr)
        return 2
    table = calibrate(samples)
    text = json.dumps(table, indent=1, sort_keys=True)
    if a.write:
        TOL_FILE.write_text(text + "\n")
        print(f"wrote {TOL_FILE} version {table['version']} from {len(samples)} samples")
    else:
        print(text)
    return 0


def cmd_report(a) -> int:
    from .records import check_dirs

    check_dirs([Path(d) for d in a.dirs])  # before the page's folder is made
    page = _write_report([Path(d) for d in a.dirs], Path(a.output))
    if page is None:
        print("parity report: the HTML report module is not available", file=sys.stderr)
        return 2
    print(f"report: {page.resolve()}")
    return 0


def cmd_repro(a) -> int:
    from .backends import SpecError, check_specs
    from .repro import write_repro

    try:
        case = Case.from_id(a.case_id)
        check_size(case, a.max_elements, a.max_bytes)
        spec = a.candidate or a.backend
        check_specs([spec])
        path = write_repro(case, spec, Path(a.output))
    except (CaseError, SpecError, ValueError) as e:
        raise UsageError(str(e)) from None
    print(
        f"wrote {path.parent}/ (inputs.npz, oracle.npz, case.json, repro.py); run: cd {path.parent} && python repro.py"
    )
    return 0


def cmd_diff(a) -> int:
    from .diff import DiffRefusal, diff_runs, format_diff
    from .records import check_dirs

    check_dirs([Path(a.base), Path(a.new)])  # RecordError: exit 2 (main)
    try:
        result = diff_runs([Path(a.base)], [Path(a.new)], a.max_ratio)
    except DiffRefusal as e:
        print(f"parity diff: refused: {e}", file=sys.stderr)
        return 2
    print(format_diff(result, verbose=a.verbose))
    if a.output:
        from .html.build import write_diff_page

        print(f"diff page: {write_diff_page(result, Path(a.output)).resolve()}")
    return 0 if result["ok"] else 1


def tpu_options(sp) -> None:
    sp.add_argument(
        "--tpu-targets",
        default=None,
        help=f"compile jax candidates for these TPU targets ({', '.join(TPU_TARGETS)}) or 'none'; "
        "default v5e,v6e,tpu7x where libtpu is installed and no TPU is attached",
    )


class Parser(argparse.ArgumentParser):
    """Bad arguments: one line naming the argument and the allowed values, exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message}\n")


def _limits(sp) -> None:
    sp.add_argument(
        "--max-elements",
        type=check.positive_int,
        default=MAX_INPUT_ELEMENTS,
        help=f"refuse a case whose inputs exceed this many elements (default {MAX_INPUT_ELEMENTS})",
    )
    sp.add_argument(
        "--max-bytes",
        type=check.positive_int,
        default=MAX_INPUT_BYTES,
        help=f"refuse a case whose inputs exceed this many bytes in float64 (default {MAX_INPUT_BYTES})",
    )


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="parity",
        allow_abbrev=False,
        description="Parity harness for linear-attention kernels: "
        "FLA Triton (GPU) vs JAX Pallas (TPU) vs a float64 oracle.",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser
    sub.add_parser = lambda *a, **k: add(*a, allow_abbrev=False, **k)

    def selection(sp, single=False):
        sp.add_argument("--suite", help="smoke, ci, stability, varlen, full, models, fla-tests")
        sp.add_argument("--cases", help="JSON file: a list of case dicts or ids")
        if single:
            sp.add_argument("--case", action="append", help="a case id (repeatable)")
        sp.add_argument("--op", help="only this op: " + ", ".join(OPS))
        _limits(sp)

    sp = sub.add_parser("cases", help="list a suite's case ids")
    selection(sp)
    sp.add_argument("--json", action="store_true", help="print a JSON list of case dicts")
    sp.set_defaults(fn=cmd_cases)

    sp = sub.add_parser("run", help="run cases through backends and write per-case reports")
    selection(sp, single=True)
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
        "--bound-factor", type=check.bound_factor, default=1.0, help="eps_candidate <= F * eps_reference + floor"
    )
    sp.add_argument("--no-html", action="store_true", help="do not write index.html")
    sp.add_argument("--no-progress", action="store_true")
    tpu_options(sp)
    sp.add_argument(
        "--tpu-numerics",
        default="",
        choices=["", "tpu-mxu-v1", "float32"],
        help="how jax candidates' dots compute off a TPU: tpu-mxu-v1 (default: as the TPU's MXU) "
        "or float32 (interpret mode's own, for comparison)",
    )
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser(
        "compile", help="compile jax candidates for TPU targets with the real TPU compiler (no execution)"
    )
    selection(sp, single=True)
    sp.add_argument(
        "--backends",
        type=check.backend_list,
        default=check.backend_list("pallas,pallas-fused"),
        help="comma-separated jax candidates (default pallas,pallas-fused)",
    )
    sp.add_argument("--candidate", action="append", help="NAME=jax|pallas:MODULE:FUNCTION (repeatable)")
    sp.add_argument(
        "--tpu-targets", default=None, help=f"comma-separated, from {list(TPU_TARGETS)} (default v5e,v6e,tpu7x)"
    )
    sp.add_argument("--out", type=check.output_dir, help="output directory (default reports/compile-<suite>)")
    sp.add_argument("-j", "--jobs", type=check.positive_int, default=1, help="parallel worker processes")
    sp.add_argument("-v", "--verbose", action="store_true", help="print each kernel's MXU matmul passes per target")
    sp.set_defaults(fn=cmd_compile)

    sp = sub.add_parser("mutants", help="run the catalogue of mutant kernels and score what the harness catches")
    selection(sp, single=True)
    sp.add_argument(
        "--out", type=check.output_dir, default="reports/mutants", help="output directory (default reports/mutants)"
    )
    sp.add_argument("--only", action="append", help="run only this mutant (repeatable)")
    sp.add_argument("--list", action="store_true", help="print the catalogue as JSON and exit")
    sp.add_argument("-j", "--jobs", type=check.positive_int, default=1, help="parallel worker processes")
    sp.add_argument("--timeout", type=check.seconds, default=900.0, help="seconds per backend call before it is killed")
    sp.add_argument("--bound-factor", type=check.bound_factor, default=1.0)
    sp.add_argument("--no-html", action="store_true", help="do not write index.html")
    sp.add_argument("--no-progress", action="store_true")
    tpu_options(sp)
    sp.set_defaults(fn=cmd_mutants)

    sp = sub.add_parser("fuzz", help="hypothesis search over the case space for a failing case; shrinks it")
    sp.add_argument(
        "--op",
        help="op(s) to search, comma-separated: " + ", ".join(OPS) + " (default: every op the "
        "candidate has a kernel for)",
    )
    sp.add_argument(
        "--backends",
        type=check.backend_list,
        default=check.backend_list("oracle"),
        help="oracle, or oracle,fla to enforce the bound against FLA (default oracle)",
    )
    sp.add_argument(
        "--candidate",
        help="the kernel searched: pallas, pallas-fused, mutant:NAME or "
        "NAME=FRAMEWORK:MODULE:FUNCTION (none with --backends oracle,fla: FLA itself)",
    )
    sp.add_argument(
        "--time", type=check.seconds, default=60.0, help="seconds per op and search to draw examples (default 60)"
    )
    sp.add_argument(
        "--shrink-time",
        type=check.seconds,
        default=300.0,
        help="seconds more to shrink a failure once found (default 300)",
    )
    sp.add_argument("--max-examples", type=check.positive_int, default=10**6, help="examples per search at most")
    sp.add_argument("--seed", type=_seed, default=0, help="seed of the search (search i of -j uses seed + i)")
    sp.add_argument("-j", "--jobs", type=check.positive_int, default=1, help="independent searches per op, in parallel")
    sp.add_argument(
        "--timeout",
        type=check.seconds,
        default=300.0,
        help="seconds a backend may spend on one case before it is killed (a finding)",
    )
    sp.add_argument(
        "--max-elements",
        type=check.positive_int,
        default=2**18,
        help="input elements of a drawn case at most (default 2^18: seconds per example on a CPU)",
    )
    sp.add_argument(
        "--bound-factor", type=check.bound_factor, default=1.0, help="eps_candidate <= F * eps_reference + floor"
    )
    sp.add_argument(
        "--out", type=check.output_dir, default="reports/fuzz", help="output directory (default reports/fuzz)"
    )
    sp.add_argument(
        "--tpu-numerics",
        default="",
        choices=["", "tpu-mxu-v1", "float32"],
        help="how jax candidates' dots compute off a TPU, as for parity run (default tpu-mxu-v1)",
    )
    sp.add_argument("--no-progress", action="store_true")
    sp.set_defaults(fn=cmd_fuzz)

    sp = sub.add_parser("gate", help="merge results (any machines) and enforce the TPU <= GPU bound")
    sp.add_argument("dirs", nargs="+")
    sp.add_argument("--bound-factor", type=check.bound_factor, default=1.0)
    sp.add_argument("--out", type=check.output_file, help="where to write gate.json (default DIR/gate.json)")
    sp.add_argument(
        "--allow-partial",
        action="store_true",
        help="gate the readable records even when a manifest's records are missing or a file is unreadable "
        "(listed in the summary); for people who know what they merge",
    )
    sp.add_argument(
        "--allow-mixed-numerics",
        action="store_true",
        help="merge a candidate's records computed under different numerics models",
    )
    sp.set_defaults(fn=cmd_gate)

    sp = sub.add_parser("calibrate", help="fit tolerance coefficients from reference-side epsilons")
    sp.add_argument("dirs", nargs="+")
    sp.add_argument("--write", action="store_true", help="write parity/tolerances.json (a new version)")
    sp.set_defaults(fn=cmd_calibrate)

    sp = sub.add_parser("report", help="write the HTML report")
    sp.add_argument("dirs", nargs="+")
    sp.add_argument("-o", "--output", type=check.output_file, required=True)
    sp.set_defaults(fn=cmd_report)
    sp = sub.add_parser("repro", help="write one case's inputs, oracle and a standalone script that reruns it")
    sp.add_argument("case_id")
    sp.add_argument("--backend", default="pallas", help="pallas, pallas-fused or fla (default pallas)")
    sp.add_argument("--candidate", help="NAME=FRAMEWORK:MODULE:FUNCTION instead of a built-in kernel")
    sp.add_argument("-o", "--output", type=check.output_dir, required=True)
    _limits(sp)
    sp.set_defaults(fn=cmd_repro)

    sp = sub.add_parser("diff", help="per case and tensor, eps_new / eps_base between two runs of the same cases")
    sp.add_argument("base", help="the baseline run's directory")
    sp.add_argument("new", help="the new run's directory")
    sp.add_argument(
        "--max-ratio",
        type=check.max_ratio,
        default=1.25,
        help="fail when a tensor's error grows by more than this factor (default 1.25)",
    )
    sp.add_argument("-o", "--output", type=check.output_file, help="also write the diff as an HTML page")
    sp.add_argument("-v", "--verbose", action="store_true", help="print every tensor, not only the flagged ones")
    sp.set_defaults(fn=cmd_diff)
    return p


def _internal_error(a) -> str:
    """Write the current exception's traceback to a log file (in the output directory when
    there is one, else the temp directory); returns its path."""
    text = f"parity {a.cmd} {' '.join(sys.argv[1:])}\n{traceback.format_exc()}"
    name = f"parity-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for d in (getattr(a, "out", None), tempfile.gettempdir()):
        if d and Path(d).is_dir():
            try:
                path = Path(d) / name
                path.write_text(text)
                return str(path)
            except OSError:
                continue
    return "(could not be written)"


def main(argv: list[str] | None = None) -> int:
    from .backends import SpecError
    from .gate import GateRefusal
    from .records import RecordError

    a = build_parser().parse_args(argv)
    try:
        return a.fn(a)
    except (UsageError, CaseError, SpecError, RecordError) as e:
        print(f"parity {a.cmd}: {e}", file=sys.stderr)
        return 2
    except GateRefusal as e:
        print(f"parity {a.cmd}: refused: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `parity cases | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"parity {a.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - exit 3 with a pointer, never a traceback that looks like a result
        path = _internal_error(a)
        print(
            f"parity {a.cmd}: internal error: {type(e).__name__}: {str(e)[:300]} (traceback in {path})", file=sys.stderr
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
