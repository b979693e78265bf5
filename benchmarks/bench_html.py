"""How big and how slow is the report for many cases? Synthetic records, real comparator.

    .venv/bin/python benchmarks/bench_html.py [N_CASES] [OUT_DIR]   (default 2000, /tmp/parity-html-bench)

Compares three fwd+bwd tensor sets (a good, a localised-bad and a NaN candidate) once with
`compare_tensor`, then writes N cases x (oracle, fla, pallas, pallas-fused) records that
reuse them under distinct case ids, and times `write_report` and reports the sizes.
"""

from __future__ import annotations

import copy
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from cases import Case
from parity.html import write_report
from parity.measure.compare import compare_tensor
from parity.model.verdict import worst_verdict
from parity.records import base_record, result_path, write_json


def _tensor_sets(case: Case) -> dict[str, dict]:
    rng = np.random.default_rng(0)
    shapes = {
        "o": (1, case.T, case.H, case.V),
        "ht": (1, case.H, case.K, case.V),
        "dq": (1, case.T, case.H, case.K),
        "dk": (1, case.T, case.H, case.K),
        "dv": (1, case.T, case.H, case.V),
        "dg": (1, case.T, case.H),
        "dh0": (1, case.H, case.K, case.V),
    }
    oracle = {n: rng.standard_normal(s) for n, s in shapes.items() if n in case.output_names()}
    noisy = lambda rel: {n: a + rel * rng.standard_normal(a.shape) for n, a in oracle.items()}
    bad = noisy(1e-7)
    bad["o"][:, case.T // 2 :, 1] += 1e-3
    nan = noisy(1e-7)
    nan["dq"][0, -5:] = np.nan
    sets = {"ref": noisy(1e-7), "good": noisy(5e-8), "bad": bad, "nan": nan}
    return {k: {n: compare_tensor(case, n, x, oracle[n]) for n, x in v.items()} for k, v in sets.items()}, oracle


def write_synthetic(out: Path, n_cases: int) -> None:
    base = Case("simple_gla", 1, 512, 2, 64, 64, h0=True, ht=True)
    sets, oracle = _tensor_sets(base)
    stats = {
        n: {
            "shape": list(a.shape),
            "rms": float(np.sqrt(np.mean(a**2))),
            "max_abs": float(np.abs(a).max()),
            "nonfinite": 0,
            "verdict": "pass",
        }
        for n, a in oracle.items()
    }
    for i in range(n_cases):
        case = base.replace(seed=i, dtype=("float32", "bfloat16")[i % 2], chunk_size=(64, 128)[(i // 2) % 2])
        kind = "bad" if i % 97 == 5 else "nan" if i % 211 == 7 else "good"
        for backend, side, tset in (
            ("oracle", "oracle", None),
            ("fla", "reference", "ref"),
            ("pallas", "candidate", kind),
            ("pallas-fused", "candidate", "good"),
        ):
            rec = base_record(case, backend, backend, side, f"{i:064x}", "bench")
            rec.update(
                status="ok",
                platform="cpu:bench",
                implementation="bench",
                versions={"jax": "0"},
                kernel_time_s=0.1,
                wall_time_s=0.1,
                error=None,
                notes={},
            )
            rec["tensors"] = copy.deepcopy(stats) if tset is None else copy.deepcopy(sets[tset])
            rec["verdict"] = worst_verdict(t["verdict"] for t in rec["tensors"].values())
            write_json(result_path(out, backend, case.id), rec)


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 2000
    out = Path(argv[1]) if len(argv) > 1 else Path("/tmp/parity-html-bench")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    write_synthetic(out, n)
    t1 = time.perf_counter()
    page = write_report([out], out / "index.html")
    t2 = time.perf_counter()
    cases = sorted((out / "index_files" / "cases").glob("*.js"))
    sizes = [f.stat().st_size for f in cases]
    print(f"{n} cases, {4 * n} records written in {t1 - t0:.1f} s; write_report {t2 - t1:.1f} s")
    print(
        f"index.html {page.stat().st_size / 1e6:.2f} MB; {len(cases)} case files, "
        f"median {np.median(sizes) / 1e3:.1f} kB, max {max(sizes) / 1e3:.1f} kB, total {sum(sizes) / 1e6:.1f} MB; "
        f"plotly.min.js {(out / 'index_files' / 'plotly.min.js').stat().st_size / 1e6:.1f} MB "
        "(loaded on first detail view)"
    )
    print(f"page: {page.resolve()}")


if __name__ == "__main__":
    main(sys.argv[1:])
