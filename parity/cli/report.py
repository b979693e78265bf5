"""`parity report`: write the HTML report (parity.html) of run directories."""

from __future__ import annotations

import sys
from pathlib import Path

from parity.cli import args as check
from parity.cli.common import write_report
from parity.records import check_dirs


def add_parser(sub) -> None:
    sp = sub.add_parser("report", help="write the HTML report")
    sp.add_argument("dirs", nargs="+", metavar="DIR", help="run directories")
    sp.add_argument("-o", "--output", metavar="FILE", type=check.output_file, required=True, help="the page to write")
    sp.set_defaults(fn=cmd_report)


def cmd_report(a) -> int:
    check_dirs([Path(d) for d in a.dirs])  # before the page's folder is made
    page = write_report([Path(d) for d in a.dirs], Path(a.output))
    if page is None:
        print("parity report: the HTML report module is not available", file=sys.stderr)
        return 2
    print(f"report: {page.resolve()}")
    return 0
