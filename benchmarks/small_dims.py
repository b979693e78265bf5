"""The small-dims end of the tolerance model (parity.measure.tol): FLA against the oracle at
K and V from 8, chunk 16 and 32, T from 1, and how far the tolerance would have to stop
shrinking for FLA to pass its own tolerance there (not a test: it takes a few minutes).

    .venv/bin/python benchmarks/small_dims.py [--out /tmp/small-dims] [-j 1]

Two sweeps of fwd+bwd cases with h0 and ht, both dtypes and the three ops, drawn from a grid of
(K, V), chunk and T (T = chunk + 1: a one-token tail): the fitting sweep (seed 0, B = 1,
g_logsig) and a check sweep (other draws, input seed 1, B = 2, g_logsig and g_stress). Each runs
through `parity run --backends oracle,fla`; then, for floors K0 and C0 under which K and the
chunk size count as K0 and C0 in growth(), the worst FLA eps / tol over each sweep and where.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import subprocess
import sys
from pathlib import Path

from cases import Case
from parity.measure import tol as T
from parity.records import iter_results

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = {  # name -> (random seed of the draw, cases per op and dtype, (K, V) pairs, gates, B, input seed)
    "fit": (0, 14, [(8, 8), (16, 16), (32, 32), (8, 64), (64, 8)], ["g_logsig"], 1, 0),
    "check": (1, 16, [(8, 8), (16, 16), (32, 32), (8, 64), (64, 8), (16, 32)], ["g_logsig", "g_stress"], 2, 1),
}


def sweep(name: str) -> list[Case]:
    draw_seed, per, kvs, gates, B, seed = SWEEPS[name]
    rng = random.Random(draw_seed)
    out = []
    for op in ("simple_gla", "gla", "kda"):
        for dtype in ("float32", "bfloat16"):
            combos = list(itertools.product(kvs, [16, 32], [1, 2, 17, 48], gates))
            rng.shuffle(combos)
            for (K, V), C, t, gate in combos[:per]:
                out.append(Case(op, B, C + 1 if t == 17 else t, 2, K, V, dtype, C, gate, h0=True, ht=True, seed=seed))
    return out


def growth(case: Case, K0: int, C0: int) -> float:
    """tol.growth with K and chunk counted as at least K0 and C0."""
    return (
        math.sqrt(max(case.K, K0) / 64)
        * math.sqrt(max(case.chunk_size, C0) / 64)
        * (1 + 0.5 * math.log2(max(1.0, case.T / case.chunk_size)))
    )


def worst(samples, K0: int, C0: int) -> tuple[float, str, str]:
    """max over samples of FLA eps / tol (tol with floors K0, C0), with its case and tensor."""
    return max(
        (
            eps / max(T.coef(c, n) * T.UNIT[c.dtype] * growth(c, K0, C0), T.ROUNDOFF[T.output_dtype(c, n)]),
            c.id,
            n,
        )
        for c, n, eps in samples
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/small-dims"))
    ap.add_argument("-j", "--jobs", type=int, default=1)
    a = ap.parse_args()
    for name in SWEEPS:
        out = a.out / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "cases.json").write_text(json.dumps([c.to_dict() for c in sweep(name)]))
        cmd = [sys.executable, "-m", "parity", "run", "--cases", str(out / "cases.json"), "--backends", "oracle,fla"]
        cmd += ["--out", str(out / "run"), "-j", str(a.jobs), "--no-html", "--no-progress", "--tpu-targets", "none"]
        subprocess.run(cmd, cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
        samples = [
            (Case.from_dict(rec["case"]), n, t["rel_rms"])
            for _, rec in iter_results([out / "run"])
            if rec["side"] == "reference" and rec["status"] == "ok"
            for n, t in rec["tensors"].items()
            if t.get("rel_rms") is not None
        ]
        print(f"## {name} sweep: {len(samples)} tensors; worst FLA eps / tol with K, chunk floored at K0, C0")
        for K0, C0 in itertools.product((8, 16, 32, 64), (16, 32, 64)):
            r, case_id, tensor = worst(samples, K0, C0)
            print(f"  K0={K0:3d} C0={C0:3d}  {r:6.3f}  {case_id} {tensor}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
