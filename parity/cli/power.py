"""`parity power DIR`: the gate's power against controlled degradations (parity.judge.power);
writes power.json and power.md to --out (default DIR) and prints the table."""

from __future__ import annotations

import sys
from pathlib import Path

from parity.cli import args as check
from parity.cli.common import bound_factor_option
from parity.judge.power import LEVELS, REPS, format_table, ladder
from parity.records import write_json


def add_parser(sub) -> None:
    sp = sub.add_parser(
        "power",
        help="the gate's power: synthetic candidates at r x the reference's compute error, through the gate",
    )
    sp.add_argument("dirs", nargs="+", metavar="DIR", help="run directories holding the reference's (fla) records")
    sp.add_argument(
        "--reps", metavar="N", type=check.positive_int, default=REPS, help=f"draws per level (default {REPS})"
    )
    bound_factor_option(sp)
    sp.add_argument(
        "--seeds", metavar="MIN:MAX", type=check.seeds, default=None, help="seed policy MIN:MAX (default: parity run's)"
    )
    sp.add_argument(
        "--out", metavar="DIR", type=check.output_dir, help="where to write power.json and power.md (default DIR)"
    )
    sp.set_defaults(fn=cmd_power)


def cmd_power(a) -> int:
    kw = {"seeds_policy": a.seeds} if a.seeds else {}
    result = ladder(
        [Path(d) for d in a.dirs],
        LEVELS,
        a.reps,
        a.bound_factor,
        progress=lambda m: print(f"parity power: {m}", file=sys.stderr),
        **kw,
    )
    out = Path(a.out or a.dirs[0])
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "power.json", result)
    table = format_table(result)
    (out / "power.md").write_text(table + "\n")
    print(table)
    worst = f"> {LEVELS[-1]:g} ({len(result['not_caught'])} rows)" if result["not_caught"] else result["worst_r_95"]
    print(
        f"parity power: {result['cases']} cases, worst r_95 {worst}, "
        f"largest false-alarm share at r <= 1.0: {result['max_false_alarm']}"
    )
    return 0
