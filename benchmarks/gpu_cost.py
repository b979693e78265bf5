"""What the GPU side costs to compile, measured on this CPU, and the cold wall time it predicts on a
16-core GPU machine (docs/fla-on-gpu.md, "The cost of a cold GPU side").

For each suite, the run's pre-compile (parity.execute.backends.fla_compile) plans the suite's FLA
launches and compiles each (kernel, specialisation, config) once for an H100 (sm_90) on this CPU,
through a pool of JOBS processes, into an empty Triton cache: the kernels to compile, each one's
CPU-seconds (its process and ptxas), the plan's wall time. Under Triton 3.6.0 by default, the
version torch 2.11's CUDA wheels pin (the H200 image's; its FLA refuses gated backwards on
Hopper, fla#640, so those cases stop part-way in the plan, as on the GPU): the pool imports
.venv/pkgs/triton-3.6.0 first (scripts/env.sh installs it; `--triton installed` keeps the
environment's).

The prediction for a machine with CORES cores (default 16, the H100 and H200 machines' count):
    import    PRE_IMPORT_S: the slowest of 14 processes importing torch, Triton and FLA and starting
              CUDA at once on the H200 (8.1 s, 2026-11-28; shared/gpu-records/h200-2026-11-28)
    plan      the plan's measured CPU-seconds here (FLA's host code per case, every launch stopped
              before it compiles) / CORES
    compile   the kernels' measured CPU-seconds handed out in the pool's order, each to the first of
              CORES processes to be free (the makespan), at this CPU's speed per core
and for the ci suite's `parity run --backends oracle,fla --seeds 2:2` with CORES workers, besides:
    start     the command's own start before its run loop, measured here
    oracle    the oracle's measured case time here (a cold harness cache, `--backends oracle`) / CORES
    lane      FLA's calls on its one lane, LANE_CALL_S each: not measurable without a GPU (the H200's
              records put FLA's kernels at 1-2 ms a call), an allowance to be replaced by the GPU truth
The GPU machine's cores are taken to be as fast as this machine's; the script prints its table in
the docs' format.

    python benchmarks/gpu_cost.py [--suites smoke,ci,stages] [--jobs 2] [--cores 16] [--triton 3.6.0]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRE_IMPORT_S = 8.1
LANE_CALL_S = 0.1


def makespan(costs: list[float], cores: int) -> float:
    """The wall time of `costs` handed out in order, each to the first of `cores` processes free."""
    free = [0.0] * cores
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def measure(suite: str, jobs: int, path_first: str | None) -> dict:
    """The pre-compile of `suite` for sm_90 on this CPU into an empty Triton cache."""
    from cases import get_suite
    from parity.execute.backends import fla_compile

    cases = get_suite(suite)
    with tempfile.TemporaryDirectory(prefix="gpu-cost-triton-") as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        t0 = time.perf_counter()
        report = fla_compile.precompile(cases, jobs=jobs, on_gpu=False, path_first=path_first)
        wall = time.perf_counter() - t0
    costs = [r.cpu_s for r in report.results]
    return {
        "suite": suite,
        "triton": report.triton,
        "cases": len(cases),
        "launches": report.launches,
        "kernels": len(report.results),
        "compiled": len(report.compiled),
        "failed": len(report.failed),
        "plan_stopped": len(report.stopped),
        "compile_cpu_s": sum(costs),
        "costs": costs,
        "median_s": statistics.median(costs) if costs else 0.0,
        "max_s": max(costs, default=0.0),
        "plan_cpu_s": report.plan_cpu_s,
        "wall_s": wall,
    }


SEEDS = 2


def oracle_time(jobs: int) -> dict:
    """The ci suite's oracle with SEEDS seeds from a cold harness cache: the whole command's wall and
    the workers' case time here."""
    with tempfile.TemporaryDirectory(prefix="gpu-cost-") as tmp:
        env = {**os.environ, "PARITY_CACHE": str(Path(tmp) / "cache")}
        seeds, out = f"{SEEDS}:{SEEDS}", str(Path(tmp) / "o")
        options = ["--backends", "oracle", "--seeds", seeds, "-j", str(jobs), "--tpu-targets", "none"]
        cmd = [
            sys.executable,
            "-m",
            "parity",
            "run",
            "--suite",
            "ci",
            *options,
            "--no-html",
            "--no-progress",
            "--out",
            out,
        ]
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        summary = json.loads((Path(out) / "summary.json").read_text())
    t = summary["timing"]
    return {"case_total_s": t["case_total_s"], "start_s": wall - t["wall_s"], "calls": len(summary["results"]) * SEEDS}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suites", default="smoke,ci,stages")
    p.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--cores", type=int, default=16)
    p.add_argument("--triton", default="3.6.0", help="3.6.0 (the GPU image's, from .venv/pkgs) or installed")
    a = p.parse_args()
    path_first = None
    if a.triton != "installed":
        path_first = str(ROOT / ".venv" / "pkgs" / f"triton-{a.triton}")
        if not Path(path_first, "triton", "__init__.py").is_file():
            sys.exit(f"gpu_cost.py: Triton {a.triton} is not in {path_first} (scripts/env.sh installs 3.6.0)")
    print(f"Triton {a.triton}, {a.jobs} processes here, predicted for {a.cores} cores", flush=True)
    rows = []
    for suite in a.suites.split(","):
        m = measure(suite, a.jobs, path_first)
        m["predicted_s"] = PRE_IMPORT_S + m["plan_cpu_s"] / a.cores + makespan(m["costs"], a.cores)
        rows.append(m)
        print(
            json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in m.items() if k != "costs"}),
            flush=True,
        )
    print()
    print(
        "| suite | cases | launches | kernels to compile | compiled for sm_90 here: CPU-s (median, max) | "
        f"plan: CPU-s here | wall here ({a.jobs} processes) | predicted cold pre-compile, {a.cores} cores |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for m in rows:
        print(
            f"| {m['suite']} | {m['cases']} | {m['launches']} | {m['kernels']}"
            + (f" ({m['plan_stopped']} cases stop at FLA's refusal)" if m["plan_stopped"] else "")
            + f" | {m['compile_cpu_s']:.0f} ({m['median_s']:.2f}, {m['max_s']:.2f}) | {m['plan_cpu_s']:.1f}"
            + f" | {m['wall_s']:.0f} s | {m['predicted_s']:.0f} s |"
        )
    if "ci" in a.suites.split(","):
        ci = next(m for m in rows if m["suite"] == "ci")
        oracle = oracle_time(a.jobs)
        fla_calls = oracle["calls"]
        lane = fla_calls * LANE_CALL_S
        total = oracle["start_s"] + ci["predicted_s"] + oracle["case_total_s"] / a.cores + lane
        print()
        print(
            f"ci, `parity run --backends oracle,fla --seeds {SEEDS}:{SEEDS} -j {a.cores}` cold, predicted: the "
            f"command's start {oracle['start_s']:.1f} s (here) + pre-compile {ci['predicted_s']:.0f} s + oracle "
            f"{oracle['case_total_s']:.1f} case-s here / {a.cores} = {oracle['case_total_s'] / a.cores:.1f} s + FLA "
            f"on one lane {fla_calls} calls x {LANE_CALL_S} s = {lane:.0f} s: {total:.0f} s (no overlap counted)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
