"""Where the seconds of a CI run go (not a test): read what `bash scripts/test.sh` leaves behind
and print the profile.

    bash scripts/test.sh                     # writes reports/timing/ and reports/pytest/
    .venv/bin/python benchmarks/profile_ci.py [--timing reports/timing] [--records reports/pytest] [--top 15]
    .venv/bin/python benchmarks/profile_ci.py --before OLD/reports/timing --before-records OLD/reports/pytest
                                             # the same tables with an earlier run's figures beside

Prints four tables:
  phases      wall time of each step of scripts/test.sh (set-up, ruff, lint-imports, the pytest
              session, the page), from reports/timing/phases.txt;
  modules     per test module, over the run's JUnit files (the session's tests.xml; an older
              run's unit.xml and interpret.xml): tests, summed test seconds (over both workers,
              so the tests' wall time is about half the sum), share of the sum;
  slowest     the slowest single tests;
  backends    for the interpret parity tests' records: per backend and op, cases and summed
              wall seconds (a jax candidate's first call includes its XLA compile; FLA's is the
              Triton interpreter; the oracle's is mostly its on-disk cache when warm), and the
              TPU compile check's seconds per target.
"""

from __future__ import annotations

import argparse
import collections
import json
import xml.etree.ElementTree as ET
from pathlib import Path


def phases(timing: Path) -> list[tuple[str, float, str]]:
    path = timing / "phases.txt"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, secs, *rc = line.split("\t")
        rows.append((name, float(secs), rc[0] if rc else ""))
    return rows


def junit_tests(path: Path) -> list[tuple[str, str, float, str]]:
    """(module, test name, seconds, outcome) per test case of a JUnit XML file."""
    rows = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        module = tc.get("classname", "").split(".")
        module = ".".join(module[:2]) if module[:1] == ["tests"] else ".".join(module)
        outcome = "skipped" if tc.find("skipped") is not None else "failed" if tc.find("failure") is not None else "ok"
        rows.append((module, tc.get("name", ""), float(tc.get("time", 0.0)), outcome))
    return rows


def backend_times(records: Path) -> tuple[dict, dict]:
    """(backend, op) -> [cases, seconds]; target -> [compiles, seconds] from parity records."""
    run, comp = collections.defaultdict(lambda: [0, 0.0]), collections.defaultdict(lambda: [0, 0.0])
    for path in sorted(records.glob("*/*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        op = rec.get("case", {}).get("op") or rec.get("case_id", "?").split("-")[0]
        if rec.get("kind") == "compile":
            for target, t in (rec.get("targets") or {}).items():
                comp[target][0] += 1
                comp[target][1] += t.get("seconds") or 0.0
        elif rec.get("wall_time_s") is not None:
            row = run[(rec.get("backend", "?"), op)]
            row[0] += 1
            row[1] += rec["wall_time_s"]
    return run, comp


def module_seconds(timing: Path) -> dict[str, list]:
    """test module -> [tests, summed test seconds], over every JUnit file of the run (one session's
    tests.xml; an older run's unit.xml and interpret.xml), so that runs of either layout compare."""
    per: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for xml in sorted(timing.glob("*.xml")):
        for module, _, secs, _ in junit_tests(xml):
            per[module][0] += 1
            per[module][1] += secs
    return per


def _before(table: dict, key) -> str:
    """The earlier run's figure beside this one's ('' without --before)."""
    if table is None:
        return ""
    return f"  (before {table[key]:7.0f})" if key in table else "  (before       -)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timing", type=Path, default=Path("reports/timing"))
    ap.add_argument("--records", type=Path, default=Path("reports/pytest"))
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--before", type=Path, help="an earlier run's timing directory, shown beside")
    ap.add_argument("--before-records", type=Path, help="an earlier run's parity records, shown beside")
    a = ap.parse_args()

    rows = phases(a.timing)
    old = {name: secs for name, secs, _ in phases(a.before)} if a.before else None
    print("## phases (wall seconds)")
    for name, secs, rc in rows or [("(no reports/timing/phases.txt: run bash scripts/test.sh)", 0.0, "")]:
        print(f"  {name:40s} {secs:7.0f}{_before(old, name)} {('exit ' + rc) if rc else ''}")

    tests = [(xml.stem, *r) for xml in sorted(a.timing.glob("*.xml")) for r in junit_tests(xml)]
    per = module_seconds(a.timing)
    total = sum(secs for _, secs in per.values()) or 1.0
    old = {m: secs for m, (_, secs) in module_seconds(a.before).items()} if a.before else None
    if old is not None:
        old["(all)"] = sum(old.values())
    print(f"\n## test modules (test seconds, summed over workers: {total:.0f}{_before(old, '(all)')})")
    for module, (n, secs) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"  {module:40s} {n:5d} tests {secs:8.1f} s {100 * secs / total:5.1f}%{_before(old, module)}")

    print(f"\n## slowest {a.top} tests")
    for p, module, name, secs, outcome in sorted(tests, key=lambda r: -r[3])[: a.top]:
        print(f"  {secs:7.1f} s  [{p}] {module}::{name} {'' if outcome == 'ok' else outcome}")

    run, comp = backend_times(a.records)
    old_run = old_comp = None
    if a.before_records:
        old_run, old_comp = ({k: secs for k, (_, secs) in t.items()} for t in backend_times(a.before_records))
    print(f"\n## parity records under {a.records}: backend seconds per op")
    for (backend, op), (n, secs) in sorted(run.items(), key=lambda kv: -kv[1][1]):
        line = f"  {backend:14s} {op:11s} {n:4d} cases {secs:8.1f} s  ({secs / n:5.1f} s/case)"
        print(line + _before(old_run, (backend, op)))
    for target, (n, secs) in sorted(comp.items()):
        line = f"  TPU compile {target:7s}        {n:4d} compiles {secs:6.1f} s  ({secs / n:5.1f} s each)"
        print(line + _before(old_comp, target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
