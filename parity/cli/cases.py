"""`parity cases`: list a suite's case ids (with their labels), or with --json its case dicts."""

from __future__ import annotations

import json
import sys

from cases.suites import label
from parity.cli.common import select_cases, selection_options


def add_parser(sub) -> None:
    sp = sub.add_parser("cases", help="list a suite's case ids")
    selection_options(sp)
    sp.add_argument("--json", action="store_true", help="print a JSON list of case dicts")
    sp.set_defaults(fn=cmd_cases)


def cmd_cases(a) -> int:
    cases = select_cases(a)
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
