"""`parity compile`: compile jax candidates (pallas, pallas-fused, mutants, --candidate) for TPU
targets with the real TPU compiler on this host (parity.execute.tpu_compile), in worker processes
(parity.execute.proc); write one compile record per case and candidate, print the table and the
summary. Nothing executes."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import sys
import uuid
from pathlib import Path

from cases import Case
from parity.cli import args as check
from parity.cli.common import UsageError, prepare_out, select_cases, selection_options, tpu_targets
from parity.execute.backends import Unsupported, backend_name, check_specs, make_backend
from parity.execute.proc import take_environment, taken_at_start, worker_context
from parity.execute.tpu_compile import compile_for_targets
from parity.judge.gate import compile_problems, compile_summary, format_compile_summary
from parity.model.targets import TARGETS
from parity.records import write_json
from parity.records.manifest import write_manifest


def add_parser(sub) -> None:
    sp = sub.add_parser(
        "compile", help="compile jax candidates for TPU targets with the real TPU compiler (no execution)"
    )
    selection_options(sp, single=True)
    sp.add_argument(
        "--backends",
        metavar="LIST",
        type=check.backend_list,
        default=None,
        help="comma-separated jax candidates (default pallas,pallas-fused; none with --candidate)",
    )
    sp.add_argument("--candidate", metavar="SPEC", action="append", help="NAME=jax|pallas:MODULE:FUNCTION (repeatable)")
    sp.add_argument(
        "--tpu-targets",
        metavar="LIST",
        default=None,
        help=f"comma-separated, from {list(TARGETS)} (default v5e,v6e,tpu7x)",
    )
    sp.add_argument(
        "--out", metavar="DIR", type=check.output_dir, help="output directory (default reports/compile-<suite>)"
    )
    sp.add_argument("-j", "--jobs", metavar="N", type=check.positive_int, default=1, help="parallel worker processes")
    sp.add_argument("-v", "--verbose", action="store_true", help="print each kernel's MXU matmul passes per target")
    sp.set_defaults(fn=cmd_compile)


def cmd_compile(a) -> int:
    cases = select_cases(a)
    backends = a.backends
    if backends is None:  # the built-in kernels, unless candidates are given: then those alone
        backends = [] if a.candidate else check.backend_list("pallas,pallas-fused")
    texts = list(backends) + list(a.candidate or [])
    parsed = check_specs(texts)  # SpecError: parity.cli.main writes it with its flag
    bad = [s.text for s in parsed if s.side != "candidate" or s.framework == "torch"]
    specs = [s.text for s in parsed]
    if bad:
        raise UsageError(
            f"--backends {bad[0]!r}: parity compile compiles jax candidates for TPU "
            "(pallas, pallas-fused, mutant:NAME, --candidate NAME=jax|pallas:...)"
        )
    if a.tpu_targets is None:
        a.tpu_targets = "v5e,v6e,tpu7x"
    targets = tpu_targets(a)
    if not targets or not cases:
        raise UsageError("nothing to compile: give --tpu-targets and at least one case")
    out = prepare_out(a.out or Path(f"reports/compile-{a.suite or 'run'}"))
    print(
        f"parity compile: {len(cases)} cases x {len(specs)} candidates x {len(targets)} TPU targets -> {out} "
        "(compiled on this host for TPU; nothing executes)",
        file=sys.stderr,
    )
    records = compile_suite(cases, specs, targets, out, jobs=a.jobs)
    print(format_compile_table(records, verbose=a.verbose))
    by_case: dict = {}
    for r in records:
        by_case.setdefault(r["case_id"], {})[r["backend"]] = r
    summary = compile_summary(by_case)
    if summary:
        print(format_compile_summary(summary))
        write_json(out / "compile.json", {"kind": "compile-summary", **summary})
    failed = [r for r in records if r["verdict"] != "pass"]
    print("compile: PASS" if not failed else f"compile: FAIL ({len(failed)} case/candidate pairs)")
    return 1 if failed else 0


def _compile_task(case_dict: dict, spec: str, targets: tuple[str, ...], out_dir: str, run_id: str) -> dict | None:
    return compile_for_targets(Case.from_dict(case_dict), spec, _backend(spec), targets, Path(out_dir), run_id)


@functools.cache
def _backend(spec: str):
    """One backend per spec and process."""
    return make_backend(spec)


def compile_suite(
    cases: list[Case], specs: list[str], targets: tuple[str, ...], out_dir: Path, jobs: int = 1
) -> list[dict]:
    """Compile every (case, candidate) for the targets in `jobs` worker processes; the compile
    records (also written under out_dir), in case order. Nothing executes."""
    run_id = "compile-" + uuid.uuid4().hex[:10]
    # what is meant to be compiled, written before anything compiles (the gate refuses what is missing)
    expected = []
    for spec in specs:
        backend = _backend(spec)
        for c in cases:
            try:
                backend.compile_subject(c)
            except Unsupported:
                continue
            expected.append((c.id, backend_name(spec)))
    write_manifest(
        out_dir,
        run_id,
        "parity compile",
        [c.id for c in cases],
        [backend_name(s) for s in specs],
        tpu_targets=targets,
        compiles=expected,
    )
    tasks = [(c.to_dict(), s, tuple(targets), str(out_dir), run_id) for c in cases for s in specs]
    if jobs <= 1:
        done = [_compile_task(*t) for t in tasks]
    else:
        start = {"mp_context": worker_context(), "initializer": take_environment, "initargs": (taken_at_start(),)}
        with cf.ProcessPoolExecutor(jobs, **start) as pool:
            done = list(pool.map(_compile_task, *zip(*tasks)))
    return [r for r in done if r is not None]


def format_compile_table(records: list[dict], verbose: bool = False) -> str:
    """One line per (case, candidate): ok or the first error per target; with verbose, each
    kernel's MXU matmul classes per target and whether the numerics model agrees."""
    lines = []
    for r in records:
        cells = "  ".join(
            f"{t}:{'ok' if x['ok'] else 'ERROR'}({x.get('seconds', 0):.1f}s)" for t, x in r["targets"].items()
        )
        lines.append(f"{r['case_id']} [{r['backend']}] {r['verdict']}  {cells}")
        lines += [f"    {p}" for p in compile_problems(r)]
        if verbose:
            for t, x in r["targets"].items():
                for kernel, k in (x.get("mosaic") or {}).items():
                    check = x.get("numerics", {}).get("kernels", {}).get(kernel) or {}
                    off = check.get("vector_unit")
                    lines.append(
                        f"    {t} {kernel}: vmem {k['vmem_bytes'] / 1024:.0f} KiB, weight loads "
                        f"{k['weight_loads']}, matmuls {k['matmuls'] or 'none'}; model "
                        f"{'agrees' if check.get('agree') else 'DISAGREES'}"
                        + (f" (its {', '.join(off)} dots on the vector unit, float32)" if off else "")
                    )
    return "\n".join(lines)
