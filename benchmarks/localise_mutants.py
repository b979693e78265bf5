"""`parity localise` on every kernel mutant of the catalogue (parity.mutants: the mutants that
edit a kernel's source), each on its witness case: the stage it names against the stage its bug
lives in (Mutant.stage; "" where that is no stage's kernel), as a markdown table.

    python benchmarks/localise_mutants.py [--out DIR] [--only NAME ...]

A mutant whose witness is an op without stage cases is listed as such. Wrap mutants (a patched
call around the unmodified kernel) are listed apart: their stages are the unmodified kernels'.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from cases import Case
from cases.stages import STAGE_OPS
from parity.mutants import CATALOGUE


def localise(mutant, out: Path) -> dict:
    """The mutant's localise.json on its witness (TPU compile on v5e: the tpu-only mutants show
    there), with the seconds it took."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "parity", "localise", mutant.witness, "--candidate", f"mutant:{mutant.name}"]
    cmd += ["--out", str(out / mutant.name), "--tpu-targets", "v5e", "--no-html", "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    path = out / mutant.name / "localise.json"
    if not path.exists():
        return {"error": (p.stdout + p.stderr)[-2000:], "seconds": time.perf_counter() - t0}
    return {**json.loads(path.read_text()), "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/localise-mutants")
    ap.add_argument("--only", action="append")
    a = ap.parse_args()
    out = Path(a.out)
    rows, right, total = [], 0, 0
    for m in CATALOGUE:
        if a.only and m.name not in a.only:
            continue
        if not m.patches:
            rows.append(f"| {m.name} | {m.op} | (wrap: not a kernel edit) | | |")
            continue
        total += 1
        if Case.from_id(m.witness).op not in STAGE_OPS:
            rows.append(f"| {m.name} | {m.op} | {m.stage or '(none)'} | ({m.op} has no stage cases) | wrong |")
            continue
        r = localise(m, out)
        named = r.get("first") or "(none)"
        ok = (r.get("first") or "") == m.stage and "error" not in r
        right += ok
        verdict = r.get("op", {}).get("verdict", "error")
        rows.append(
            f"| {m.name} | {m.op} | {m.stage or '(none)'} | {named} (op: {verdict}; {r['seconds']:.0f} s) | "
            f"{'right' if ok else 'wrong'} |"
        )
        print(rows[-1], file=sys.stderr)
    print("| mutant | op | lives in | parity localise names | |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    share = 100 * right / max(1, total)
    print(f"\n{right} of {total} kernel mutants localised to the stage they live in ({share:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
