"""`parity diff`: per case and tensor, eps_new / eps_base between two runs of the same cases
(parity.judge.diff); fails when an error grew by more than --max-ratio."""

from __future__ import annotations

from pathlib import Path

from parity.cli import args as check
from parity.html.build import write_diff_page
from parity.judge.diff import diff_runs, format_diff
from parity.records import check_dirs


def add_parser(sub) -> None:
    sp = sub.add_parser("diff", help="per case and tensor, eps_new / eps_base between two runs of the same cases")
    sp.add_argument("base", help="the baseline run's directory")
    sp.add_argument("new", help="the new run's directory")
    sp.add_argument(
        "--max-ratio",
        metavar="R",
        type=check.max_ratio,
        default=1.25,
        help="fail when a tensor's error grows by more than this factor (default 1.25)",
    )
    sp.add_argument(
        "-o", "--output", metavar="FILE", type=check.output_file, help="also write the diff as an HTML page"
    )
    sp.add_argument("-v", "--verbose", action="store_true", help="print every tensor, not only the flagged ones")
    sp.set_defaults(fn=cmd_diff)


def cmd_diff(a) -> int:
    check_dirs([Path(a.base), Path(a.new)])  # RecordError, and DiffRefusal below: exit 2 (main)
    result = diff_runs([Path(a.base)], [Path(a.new)], a.max_ratio)
    print(format_diff(result, verbose=a.verbose))
    if a.output:
        print(f"diff page: {write_diff_page(result, Path(a.output)).resolve()}")
    return 0 if result["ok"] else 1
