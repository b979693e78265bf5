"""`parity gate`: merge the records of run directories (from any machines) and enforce each
candidate's tolerance and the TPU <= GPU bound (parity.judge.gate); writes gate.json."""

from __future__ import annotations

from pathlib import Path

from parity.cli import args as check
from parity.cli.common import bound_factor_option
from parity.judge.gate import format_summary, run_gate
from parity.model.options import ALLOW_UNBOUNDED_REFERENCE


def add_parser(sub) -> None:
    sp = sub.add_parser("gate", help="merge results (any machines) and enforce the TPU <= GPU bound")
    sp.add_argument("dirs", nargs="+", metavar="DIR", help="run directories to merge (from any machines)")
    bound_factor_option(sp)
    sp.add_argument(
        "--out", metavar="FILE", type=check.output_file, help="where to write gate.json (default DIR/gate.json)"
    )
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
    sp.add_argument(
        "--allow-inconclusive",
        action="store_true",
        help="pass a tensor whose bound stays undecided over the seeds its records hold (listed apart); "
        "by default it fails",
    )
    sp.add_argument("--" + ALLOW_UNBOUNDED_REFERENCE.name, action="store_true", help=ALLOW_UNBOUNDED_REFERENCE.help)
    sp.set_defaults(fn=cmd_gate)


def cmd_gate(a) -> int:
    """Exit 0 on a pass, 1 on a failure; GateRefusal (exit 2) is the command line's (parity.cli.main)."""
    result = run_gate(
        [Path(d) for d in a.dirs],
        a.bound_factor,
        Path(a.out) if a.out else None,
        allow_partial=a.allow_partial,
        allow_mixed_numerics=a.allow_mixed_numerics,
        allow_inconclusive=a.allow_inconclusive,
        allow_unbounded_reference=getattr(a, ALLOW_UNBOUNDED_REFERENCE.dest),
    )
    print(format_summary(result))
    return 0 if result["ok"] else 1
