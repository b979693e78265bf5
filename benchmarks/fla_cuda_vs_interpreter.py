"""FLA on CUDA against FLA in the Triton interpreter, both against the float64 oracle.

On a machine with a GPU:
    python benchmarks/fla_cuda_vs_interpreter.py save  DIR_CUDA  --suite ci --dtype bf16
    CUDA_VISIBLE_DEVICES= python benchmarks/fla_cuda_vs_interpreter.py save DIR_INTERP --suite ci --dtype bf16
    python benchmarks/fla_cuda_vs_interpreter.py compare DIR_CUDA DIR_INTERP
`save` writes one npz per case (FLA's tensors) and platform.json; `compare` prints, per case
and tensor, rel_rms against the oracle of each run and of one run against the other.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cases import Case, get_suite, make_inputs  # noqa: E402
from parity.execute.backends.fla import FlaBackend  # noqa: E402  (before fla: interpreter request)
from parity.execute.backends.oracle import cached_oracle  # noqa: E402
from parity.measure.compare import rel_rms  # noqa: E402


def select(a) -> list[Case]:
    cases = [Case.from_id(c) for c in a.case] if a.case else get_suite(a.suite)
    return [c for c in cases if a.dtype in (None, c.dtype)]


def save(a) -> None:
    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    platforms = {}
    for case in select(a):
        t0 = time.perf_counter()
        ex = FlaBackend().run(case, make_inputs(case))
        np.savez(out / f"{case.id}.npz", **ex.tensors)
        platforms[case.id] = {
            "platform": ex.platform,
            "kernel_time_s": ex.kernel_time_s,
            "wall_s": time.perf_counter() - t0,
        }
        print(f"{case.id}: {ex.platform} kernel {ex.kernel_time_s:.3f}s", flush=True)
    (out / "platform.json").write_text(json.dumps(platforms, indent=1))


def compare(a) -> None:
    A, B = Path(a.dir), Path(a.other)
    pa, pb = (json.loads((d / "platform.json").read_text()) for d in (A, B))
    rows = []
    for cid in sorted(set(pa) & set(pb)):
        case = Case.from_id(cid)
        ref, _, _ = cached_oracle(case, make_inputs(case))
        with np.load(A / f"{cid}.npz") as za, np.load(B / f"{cid}.npz") as zb:
            for t in sorted(set(za.files) & set(zb.files)):
                x, y = za[t].astype(np.float64), zb[t].astype(np.float64)
                rows.append(
                    {
                        "case": cid,
                        "tensor": t,
                        "eps_a": rel_rms(x, ref[t]),
                        "eps_b": rel_rms(y, ref[t]),
                        "a_vs_b": rel_rms(y, x),
                        "platform_a": pa[cid]["platform"],
                        "platform_b": pb[cid]["platform"],
                    }
                )
    for r in rows:
        print(
            f"{r['case']:70s} {r['tensor']:8s} eps[{r['platform_a']}]={r['eps_a']:.3e} "
            f"eps[{r['platform_b']}]={r['eps_b']:.3e} between={r['a_vs_b']:.3e}"
        )
    if rows:
        ratio = [r["eps_b"] / r["eps_a"] for r in rows if r["eps_a"] > 0]
        print(
            f"{len(rows)} tensors; eps_b/eps_a min {min(ratio):.3f} median {np.median(ratio):.3f} max {max(ratio):.3f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = p.add_subparsers(dest="cmd", required=True)
    s = sp.add_parser("save")
    s.add_argument("dir")
    s.add_argument("--suite", default="ci")
    s.add_argument("--case", action="append")
    s.add_argument("--dtype", choices=["bf16", "fp32"])
    s.set_defaults(fn=save)
    c = sp.add_parser("compare")
    c.add_argument("dir")
    c.add_argument("other")
    c.add_argument("--json")
    c.set_defaults(fn=compare)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
