"""`parity mutants`: run the catalogue (parity.mutants) beside the unmutated kernels and FLA
through the gate and score which cases and checks caught each mutant (parity.mutation); each
mutant stops at the first case that catches it unless --all-cases."""

from __future__ import annotations

import sys
from pathlib import Path

from parity.cli import args as check
from parity.cli.common import (
    UsageError,
    bound_factor_option,
    interpret_as_option,
    interrupted_status,
    prepare_out,
    select_cases,
    selection_options,
    tpu_options,
    tpu_targets,
    write_report,
)
from parity.execute.tpu_identity import choose, exported
from parity.model.host import tpu_attached
from parity.mutants import BY_NAME, catalogue_json
from parity.mutation import format_score, run_mutants


def add_parser(sub) -> None:
    sp = sub.add_parser("mutants", help="run the catalogue of mutant kernels and score what the harness catches")
    selection_options(sp, single=True)
    sp.add_argument(
        "--out",
        metavar="DIR",
        type=check.output_dir,
        default="reports/mutants",
        help="output directory (default reports/mutants)",
    )
    sp.add_argument("--only", metavar="NAME", action="append", help="run only this mutant (repeatable)")
    sp.add_argument(
        "--all-cases",
        action="store_true",
        help="run every mutant on every case of its op (the full catch matrix); default: stop each "
        "mutant at the first case that catches it",
    )
    sp.add_argument("--list", action="store_true", help="print the catalogue as JSON and exit")
    sp.add_argument("-j", "--jobs", metavar="N", type=check.positive_int, default=1, help="parallel worker processes")
    sp.add_argument(
        "--timeout", metavar="S", type=check.seconds, default=900.0, help="seconds per backend call before it is killed"
    )
    bound_factor_option(sp)
    sp.add_argument("--no-html", action="store_true", help="do not write index.html")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    tpu_options(sp)
    interpret_as_option(sp)
    sp.set_defaults(fn=cmd_mutants)


def cmd_mutants(a) -> int:
    if a.list:
        print(catalogue_json())
        return 0
    for n in a.only or []:
        if n not in BY_NAME:
            raise UsageError(f"--only {n!r}: expected one of {sorted(BY_NAME)}")
    if not (a.suite or a.cases or a.case):
        a.suite = "ci"
    cases = select_cases(a)
    if not cases:
        raise UsageError("no cases selected")
    targets = tpu_targets(a)
    out = prepare_out(Path(a.out))
    print(
        f"parity mutants: {len(cases)} cases -> {out}; "
        + ("every mutant on every case of its op" if a.all_cases else "each mutant stops at its first catch"),
        file=sys.stderr,
    )
    with exported(None if tpu_attached() else choose(a.tpu_interpret_as, targets)):  # workers read it
        result = run_mutants(
            cases,
            out,
            jobs=a.jobs,
            timeout_s=a.timeout,
            factor=a.bound_factor,
            names=a.only,
            progress=not a.no_progress,
            tpu_targets=targets,
            all_cases=a.all_cases,
        )
    if result.get("interrupted"):
        print(
            f"parity mutants: interrupted by {result['interrupted']}: not scored; "
            f"the gate refuses {out} until the rest is run",
            file=sys.stderr,
        )
        return interrupted_status(result["interrupted"])
    print(format_score(result))
    if not a.no_html:
        page = write_report([out], out / "index.html")
        if page:
            print(f"report: {page.resolve()}")
    return 0 if result["caught"] == result["total"] and not result["unmutated_failures"] else 1
