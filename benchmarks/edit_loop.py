"""The edit loop of a kernel engineer: the same few cases rerun after each edit of the candidate
(not a test: it takes some minutes). For each row, three times from the save (or the command) to
the verdict:

- cold: `parity run` with a fresh PARITY_CACHE (nothing cached: the oracle computed, every import);
- warm rerun: the candidate's module saved again (a comment appended), `parity run` again with the
  same PARITY_CACHE (the oracle's outputs cached; Python, jax, torch, triton imported anew);
- watch: `parity watch` on the same cases; after its first round the module is saved again and
  the time is the one it prints, from the save to the verdict (workers warm, the candidate
  re-imported).

    PYTHONPATH=. .venv/bin/python benchmarks/edit_loop.py [--out docs/edit-loop-table.md] [--rows NAME,...]

Rows: one small fwdbwd case of each op from the smoke suite, and 10 simple_gla cases of the ci
suite (those the quick start's kernel runs: no packed sequences), all against oracle and fla (FLA
in the Triton interpreter off a GPU), -j 1, the default TPU compile check. simple_gla's candidate
is the README quick start's my_gla.py; the other ops' is a module of the user's whose functions
call kernels_jax's own op (a Pallas candidate in interpret mode): its module is re-imported on a
save, kernels_jax's stays imported in a warm worker (its traced functions may be reused; a user's
own edited kernel is traced again).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MY_OPS = '''"""A candidate per op that calls kernels_jax's own kernel, in the candidate calling convention."""

import inspect

from kernels_jax.gdn import chunk_gdn
from kernels_jax.gdn2 import chunk_gdn2
from kernels_jax.gla import chunk_gla
from kernels_jax.kda import chunk_kda


def _calls(kernel):
    def candidate(*args, **kwargs):
        return kernel(*args, **kwargs)

    candidate.__signature__ = inspect.signature(kernel)  # chunk_size=: the harness passes the case's
    candidate.__name__ = kernel.__name__
    return candidate


gla, kda, gdn, gdn2 = (_calls(k) for k in (chunk_gla, chunk_kda, chunk_gdn, chunk_gdn2))
'''

SMOKE = {  # op -> a small fwdbwd case of the smoke suite
    "simple_gla": "simple_gla-fwdbwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig-h0-ht",
    "gla": "gla-fwdbwd-B1-T96-H2-K64-V64-fp32-C64-g_logsig-h0-ht",
    "kda": "kda-fwdbwd-B1-T96-H2-K64-V64-fp32-C64-g_logsig-h0-ht",
    "gdn": "gdn-fwdbwd-B1-T96-H2-K64-V64-fp32-C64-g_logsig-HV4-h0-ht",
    "gdn2": "gdn2-fwdbwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig-h0-ht",
}


def ci_cases(n: int = 10) -> list[str]:
    """The first n simple_gla cases of the ci suite without packed sequences, fwd and fwdbwd alike."""
    ids = subprocess.run(
        [sys.executable, "-m", "parity", "cases", "--suite", "ci", "--op", "simple_gla"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    plain = [i for i in ids if "-lens" not in i]
    fwd, fwdbwd = [i for i in plain if "-fwd-" in i], [i for i in plain if "-fwdbwd-" in i]
    return fwd[: n // 2] + fwdbwd[: n - n // 2]


def rows() -> dict[str, tuple[list[str], str, str]]:
    """row name -> (case ids, candidate spec, the module file the candidate lives in)."""
    out = {"simple_gla": ([SMOKE["simple_gla"]], "mine=jax:my_gla:simple_gla", "my_gla.py")}
    for op in ("gla", "kda", "gdn", "gdn2"):
        out[op] = ([SMOKE[op]], f"mine=pallas:my_ops:{op}", "my_ops.py")
    out["ci x10 (simple_gla)"] = (ci_cases(), "mine=jax:my_gla:simple_gla", "my_gla.py")
    return out


def quick_start_candidate() -> str:
    """The README quick start's my_gla.py."""
    text = (ROOT / "README.md").read_text()
    return re.search(r"<!-- file: my_gla.py -->\n```python\n(.*?)```", text, re.S).group(1)


def _env(cache: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PARITY_CACHE": str(cache)}


def _args(cases: list[str], spec: str) -> list[str]:
    return [a for c in cases for a in ("--case", c)] + ["--backends", "oracle,fla", "--candidate", spec]


def save(module: Path) -> None:
    """A save of the module that changes it: a comment appended."""
    with open(module, "a") as f:
        f.write(f"# saved {time.time()}\n")


def timed_run(user: Path, cache: Path, cases, spec) -> tuple[float, int]:
    """(seconds, exit status) of one `parity run`."""
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "parity", "run", *_args(cases, spec), "--out", "out-run", "--no-progress"],
        cwd=user,
        env=_env(cache),
        capture_output=True,
        text=True,
    )
    if p.returncode not in (0, 1):
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
    return time.perf_counter() - t0, p.returncode


def _split(timing_line: str) -> str:
    """'F / C / K': seconds in fla, the candidate and the TPU compile check of a run's timing line
    (print_table's)."""
    found = [re.search(p, timing_line) for p in (r"fla ([\d.]+)s", r"mine ([\d.]+)s", r"TPU compile check ([\d.]+) s")]
    return " / ".join(m.group(1) if m else "0" for m in found)


def watch_round(user: Path, cache: Path, cases, spec, module: Path) -> tuple[float, float, str, str]:
    """(its first round's start-to-verdict, the second round's save-to-verdict, the second's
    verdict, the second's seconds in fla / the candidate / the TPU compile check) of `parity watch
    --rounds 2`, the module saved once after the first round."""
    p = subprocess.Popen(
        [sys.executable, "-m", "parity", "watch", *_args(cases, spec), "--out", "out-watch", "--rounds", "2"],
        cwd=user,
        env=_env(cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    times, verdict, timing = [], "?", ""
    killer = threading.Timer(1800, p.kill)
    killer.start()
    try:
        for line in p.stdout:
            m = re.match(r"watch: round (\d): (PASS|FAIL|ERROR).* ([\d.]+) s from", line)
            if m:
                times.append(float(m.group(3)))
                verdict = m.group(2)
            if "; backend time: " in line:
                timing = line
            if line.startswith("watch: waiting for a save"):
                save(module)
        p.wait()
    finally:
        killer.cancel()
        if p.poll() is None:
            p.kill()
    if len(times) != 2:
        return float("nan"), float("nan"), "no second round", ""
    return times[0], times[1], verdict, _split(timing)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    ap.add_argument("--rows", default=None, help="comma-separated row names (default all)")
    a = ap.parse_args(argv)
    table = rows()
    chosen = a.rows.split(",") if a.rows else list(table)
    lines = [
        "| row | cases | candidate | cold `parity run` | warm rerun (`parity run`) | `parity watch`: first round "
        "| `parity watch`: save to verdict | of it: fla / candidate / TPU compile (s) | verdicts (run, watch) |",
        "|---|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for name in chosen:
        cases, spec, module_name = table[name]
        user = Path(tempfile.mkdtemp(prefix="edit-loop-"))
        try:
            (user / "my_gla.py").write_text(quick_start_candidate())
            (user / "my_ops.py").write_text(MY_OPS)
            module = user / module_name
            cold, rc = timed_run(user, user / "cache-cold", cases, spec)
            save(module)
            warm, rc2 = timed_run(user, user / "cache-cold", cases, spec)
            first, again, verdict, split = watch_round(user, user / "cache-cold", cases, spec, module)
        finally:
            shutil.rmtree(user, ignore_errors=True)
        run_verdict = {0: "pass", 1: "fail"}.get(rc, f"exit {rc}") + ("" if rc == rc2 else f"/exit {rc2}")
        lines.append(
            f"| {name} | {len(cases)} | `{spec.split('=', 1)[1]}` | {cold:.1f} s | {warm:.1f} s | {first:.1f} s "
            f"| **{again:.1f} s** | {split} | {run_verdict}, {verdict.lower()} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
