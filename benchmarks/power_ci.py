"""The gate's power table over a suite's fwdbwd cases (docs/bound.md, "Power"): FLA on every
case with the seeds its verdicts may use, then `parity power` over those runs.

An undecided tensor may wait for BLOCKS_ENOUGH blocks (parity.measure.compute_error), so a case whose
tensor with the fewest blocks per seed has n gets max(SEEDS_BASE, ceil(BLOCKS_ENOUGH / n)) seeds, at
most SEEDS_MAX: 8 for cases whose every tensor has 8 or more blocks per seed, up to 64 where a
[B, T, H] tensor (dg, dbeta) or dg_gamma [H] has one. The cases go to one run directory per seed
count (OUT/seeds-N), and `parity power` reads them all; the table is OUT/power.md.

Usage: .venv/bin/python benchmarks/power_ci.py OUT [--suite ci] [--reps 20] [-j 2] [--list]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from cases import Case, get_suite, output_tensors
from parity.measure.compute_error import BLOCKS_ENOUGH, SEEDS_BASE, SEEDS_MAX, block_sums


def blocks_per_seed(case: Case) -> int:
    """The fewest blocks per seed among the case's tensors (compute_error.block_sums)."""
    tensors = output_tensors(case)
    return min(len(block_sums(np.zeros(tensors[n].shape), tensors[n].layout)) for n in case.output_names())


def seeds_needed(case: Case) -> int:
    """The seeds the case's most undecided tensor may use under the default policy."""
    return min(SEEDS_MAX, max(SEEDS_BASE, math.ceil(BLOCKS_ENOUGH / blocks_per_seed(case))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--suite", default="ci")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--list", action="store_true", help="print the cases and their seeds, run nothing")
    a = ap.parse_args()
    groups: dict[int, list[str]] = defaultdict(list)
    for case in get_suite(a.suite):
        if case.backward:
            groups[seeds_needed(case)].append(case.id)
    for n, ids in sorted(groups.items()):
        print(f"{len(ids)} cases with {n} seeds", file=sys.stderr)
        if a.list:
            print("\n".join(f"  {i}" for i in ids), file=sys.stderr)
    if a.list:
        return 0
    dirs = []
    for n, ids in sorted(groups.items()):
        d = a.out / f"seeds-{n}"
        d.mkdir(parents=True, exist_ok=True)
        ids_file = a.out / f"cases-{n}.json"
        ids_file.write_text(json.dumps(ids))
        run = ["parity", "run", "--cases", str(ids_file), "--backends", "oracle,fla", "--seeds", f"{n}:{n}"]
        subprocess.run([*run, "-j", str(a.jobs), "--out", str(d), "--no-progress"], check=True)
        dirs.append(str(d))
    power = ["parity", "power", *dirs, "--reps", str(a.reps), "--out", str(a.out)]
    return subprocess.run(power, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
