"""`parity calibrate`: fit the tolerance coefficients (parity.measure.tol) from the epsilons of
the reference-side records of run directories; print the table, or with --write write it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cases import Case
from parity.measure.tol import TOL_FILE, calibrate
from parity.records import iter_results


def add_parser(sub) -> None:
    sp = sub.add_parser("calibrate", help="fit tolerance coefficients from reference-side epsilons")
    sp.add_argument("dirs", nargs="+", metavar="DIR", help="run directories holding the reference's (fla) records")
    sp.add_argument("--write", action="store_true", help="write parity/measure/tolerances.json (a new version)")
    sp.set_defaults(fn=cmd_calibrate)


def cmd_calibrate(a) -> int:
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
