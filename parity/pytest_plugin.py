"""The parity pytest plugin: markers, `--parity-*` options, registry-driven parity tests and
the session gate. Installed with the package (entry point `pytest11`, so any directory's
pytest finds it); this checkout's root conftest.py loads it when the package is not installed.

    pytest -m interpret --parity-suite smoke   FLA and Pallas through their CPU interpreters
    pytest -m gpu --parity-suite ci            FLA compiled on CUDA (skips without a GPU)
    pytest -m tpu --parity-suite ci            Pallas compiled on TPU (skips without a TPU)

A test module asks for the fixtures `parity_case` (one test per selected case) and
`parity_check(case, marker)`:

    @pytest.mark.interpret
    def test_interpret(parity_case, parity_check):
        parity_check(parity_case, "interpret")

Markers and the built-in backends they run (`--parity-backends` keeps a subset), besides
the `--parity-candidate` kernels (not on gpu):
    interpret  oracle, fla (Triton interpreter), pallas, pallas-fused (TPU interpret mode)
    gpu        oracle, fla compiled on CUDA
    tpu        oracle, pallas, pallas-fused compiled on TPU
interpret and tpu tests also compile their jax candidates for TPU targets
(`--parity-tpu-targets`). Records go to `--parity-report-dir`; the gate over this session's
records is printed in the terminal summary and fails the session when it fails.

Only the standard library and pytest are imported here: jax, torch, fla and the harness are
imported inside the hooks that need them, so the plugin costs nothing in other test suites.
Where no CUDA device exists it sets TRITON_INTERPRET=1 at configure (FLA's kernels must be
built for the Triton interpreter before fla is first imported).
"""

from __future__ import annotations

import functools
import glob
import math
import os
import sys
import uuid
import warnings
from pathlib import Path

import pytest

from parity.spec import REFERENCE  # standard library only (the backend spec's parser)

MARKERS = {
    "gpu": "FLA Triton kernels compiled on a CUDA GPU",
    "tpu": "kernels_jax Pallas kernels compiled on a TPU",
    "interpret": "FLA and Pallas kernels through their CPU interpreters (Triton interpreter, TPU interpret mode)",
    "slow": "long-running; excluded from the default unit-test pass",
}

# marker -> the built-in backend specs it runs (candidates are added on interpret and tpu)
MODE_BACKENDS = {
    "interpret": ["oracle", REFERENCE, "pallas", "pallas-fused"],
    "gpu": ["oracle", REFERENCE],
    "tpu": ["oracle", "pallas", "pallas-fused"],
}
DEFAULT_REPORT_DIR = "reports/pytest"
_GATE = pytest.StashKey[tuple[str, bool]]()


class ReferenceFinding(UserWarning):
    """FLA (the reference) outside its own tolerance or non-finite: a finding, not a failure."""


# ---------------------------------------------------------------------------------------- hooks


def pytest_addoption(parser):
    g = parser.getgroup("parity", "linear-attention parity tests (linattn-parity)")
    g.addoption("--parity-suite", default=None, help="case suite for the parity tests (default smoke)")
    g.addoption(
        "--parity-cases", default=None, metavar="FILE", help="JSON file of case dicts or ids (instead of a suite)"
    )
    g.addoption("--parity-op", default=None, help="only cases of this op")
    g.addoption(
        "--parity-report-dir",
        default=DEFAULT_REPORT_DIR,
        metavar="DIR",
        help=f"where parity tests write their records (default {DEFAULT_REPORT_DIR})",
    )
    g.addoption(
        "--parity-candidate",
        action="append",
        default=[],
        metavar="NAME=FRAMEWORK:MODULE:FUNCTION",
        help="a kernel to test (FRAMEWORK jax, pallas or torch; MODULE importable from the current "
        "directory); repeatable",
    )
    g.addoption(
        "--parity-backends",
        default=None,
        metavar="LIST",
        help="keep only these built-in backends in each marker's set (e.g. oracle,fla); default all of them",
    )
    g.addoption(
        "--parity-bound-factor",
        default=None,
        metavar="F",
        help="eps_candidate <= F * eps_reference + floor (default 1)",
    )
    g.addoption(
        "--parity-fuzz",
        type=float,
        default=None,
        metavar="SECONDS",
        help="run tests/test_fuzz.py::test_fuzz_search: parity fuzz of each op for SECONDS against pallas "
        "(or the first --parity-candidate)",
    )
    g.addoption(
        "--parity-tpu-targets",
        default=None,
        metavar="LIST",
        help="compile the jax candidates of interpret and tpu tests for these TPU targets (v4, v5e, v5p, v6e, "
        "tpu7x) or 'none'; default v5e,v6e,tpu7x where libtpu is installed and no TPU is attached",
    )


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    _refuse_bad_options(config)
    # one id for the whole session, inherited by xdist workers through the environment
    os.environ.setdefault("PARITY_RUN_ID", "pytest-" + uuid.uuid4().hex[:10])
    if _no_cuda_device():
        # FLA's kernels must be built for the Triton interpreter: ask before any test imports fla
        # (parity.backends.triton_interpreter.request(), without importing the harness here)
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_generate_tests(metafunc):
    if "parity_case" in metafunc.fixturenames:
        opt = metafunc.config.getoption
        cases = select_cases(opt("parity_suite"), opt("parity_cases"), opt("parity_op"))
        metafunc.parametrize("parity_case", cases, ids=[c.id for c in cases])


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") and _cuda_missing():
        pytest.skip(_cuda_missing())
    if item.get_closest_marker("tpu") and _tpu_missing():
        pytest.skip(_tpu_missing())


@pytest.fixture
def parity_check(request):
    """parity_check(case, marker): run the case through the marker's backends and fail with
    the full explanation (tensor, epsilons, tolerance, bound, worst element, repro)."""
    config = request.config

    def check(case, mode):
        problems, no_kernel, findings = check_case(
            case,
            mode,
            session_specs(config, mode),
            _report_dir(config),
            os.environ["PARITY_RUN_ID"],
            _bound_factor(config),
            _session_targets(config, mode),
        )
        for f in findings:
            warnings.warn(ReferenceFinding(f), stacklevel=2)
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)
        if no_kernel:  # not a pass: the kernel is an open issue
            pytest.xfail(f"no candidate kernel for this case: {no_kernel}")

    return check


def pytest_collection_finish(session):
    """The manifest of what the selected parity tests will write (parity gate refuses what is missing)."""
    write_session_manifests(session.items, session.config, os.environ["PARITY_RUN_ID"])


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # xdist worker: the controller gates
        return
    report_dir = _report_dir(session.config)
    if not report_dir.exists():
        return
    text, ok = session_gate(report_dir, os.environ["PARITY_RUN_ID"], _bound_factor(session.config))
    if text:
        session.config.stash[_GATE] = (text, ok)
    if ok is False and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    gate = config.stash.get(_GATE, None)
    if gate is not None:
        terminalreporter.write_sep("=", "parity gate")
        terminalreporter.write_line(gate[0])


# ------------------------------------------------------------------------------------- options


def _fail_usage(option: str, value, allowed: str) -> None:
    raise pytest.UsageError(f"--{option} {value!r}: expected {allowed}")


def _refuse_bad_options(config) -> None:
    """One line naming the option and the allowed values for anything given that cannot be used
    (pytest then exits 4, its usage-error code); nothing heavy is imported unless it is given."""
    opt = config.getoption
    _refuse_path_as_rootdir(config)
    if opt("parity_bound_factor") is not None:
        _bound_factor(config)
    if opt("parity_suite") is not None:
        from cases import SUITES

        if opt("parity_suite") not in SUITES:
            _fail_usage("parity-suite", opt("parity_suite"), f"one of {list(SUITES)}")
    if opt("parity_op") is not None:
        from cases import OPS

        if opt("parity_op") not in OPS:
            _fail_usage("parity-op", opt("parity_op"), f"one of {list(OPS)}")
    if opt("parity_cases") is not None and not Path(opt("parity_cases")).is_file():
        _fail_usage("parity-cases", opt("parity_cases"), "a JSON file of case dicts or ids")
    if opt("parity_backends") is not None:
        _kept_builtins(config)
    if opt("parity_candidate"):
        from parity.backends import SpecError, parse_candidate

        for spec in opt("parity_candidate"):
            try:
                parse_candidate(spec)
            except SpecError as e:
                raise pytest.UsageError(str(e).replace("--candidate", "--parity-candidate", 1)) from None
    if opt("parity_tpu_targets") is not None:
        _tpu_targets(opt("parity_tpu_targets"))


def _refuse_path_as_rootdir(config) -> None:
    """pytest picks its rootdir and ini file from the free arguments before any plugin's options
    are known, so `--parity-report-dir DIR` (two words, DIR existing) made DIR a test path there:
    without an ini file above the current directory, the rootdir comes from DIR and conftest.py
    files above it are not loaded. Refused with the spelling that works (`--parity-report-dir=DIR`)."""
    args = list(config.invocation_params.args)
    here = config.invocation_params.dir
    if config.inipath is not None and config.inipath.parent in (here, *here.parents):
        return
    for name in ("--parity-report-dir", "--parity-cases"):
        for i, a in enumerate(args[:-1]):
            value = args[i + 1]
            if a == name and Path(value).exists():
                raise pytest.UsageError(
                    f"{name} {value}: pytest took {value!r} for a test path when it chose its rootdir "
                    f"({config.rootpath}); write {name}={value}"
                )


def _bound_factor(config) -> float:
    text = config.getoption("parity_bound_factor")
    if text is None:
        return 1.0
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and factor >= 0):
        _fail_usage("parity-bound-factor", text, "a finite number >= 0")
    return factor


def _kept_builtins(config) -> set[str] | None:
    """The built-in backends --parity-backends keeps, or None for all of them."""
    text = config.getoption("parity_backends")
    if text is None:
        return None
    from parity.backends import BUILTIN

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in BUILTIN]
    if not names or bad:
        _fail_usage("parity-backends", text, f"a comma-separated list of {list(BUILTIN)}")
    return set(names)


def _report_dir(config) -> Path:
    return Path(config.getoption("parity_report_dir"))


def session_specs(config, mode: str) -> list[str]:
    """The backend specs a marker's tests run: its built-ins kept by --parity-backends, then
    the candidates (none on gpu, which runs the reference only)."""
    kept = _kept_builtins(config)
    builtins = [s for s in MODE_BACKENDS[mode] if kept is None or s in kept]
    return builtins + ([] if mode == "gpu" else list(config.getoption("parity_candidate")))


def _session_targets(config, mode: str) -> tuple[str, ...]:
    return () if mode == "gpu" else _tpu_targets(config.getoption("parity_tpu_targets"))


@functools.cache
def _tpu_targets(text: str | None) -> tuple[str, ...]:
    from parity.tpu_compile import parse_targets

    try:
        return parse_targets(text)
    except ValueError as e:
        raise pytest.UsageError(str(e).replace("--tpu-targets", "--parity-tpu-targets")) from None


def _no_cuda_device() -> bool:
    """No CUDA device here. On Linux, without /dev/nvidia<N> there is none (no torch import);
    with one, torch decides (a CPU build of torch has no CUDA either)."""
    if sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*"):
        return True
    return _cuda_missing() is not None


@functools.cache
def _cuda_missing() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA GPU visible to torch (gpu tests need FLA compiled on CUDA)"


@functools.cache
def _tpu_missing() -> str | None:
    from kernels_jax.common.platform import on_tpu

    return None if on_tpu() else "no TPU visible to jax (tpu tests need the Pallas kernels compiled by Mosaic)"


# --------------------------------------------------------------------------- cases and checking


def select_cases(suite: str | None, cases_file: str | None, op: str | None) -> list:
    """The cases of --parity-cases (a file) or --parity-suite (default smoke), of one op if given."""
    from cases import OPS, get_suite, load_cases_file

    cases = load_cases_file(cases_file) if cases_file else get_suite(suite or "smoke")
    if op:
        if op not in OPS:
            raise ValueError(f"--parity-op {op!r}: expected one of {list(OPS)}")
        cases = [c for c in cases if c.op == op]
    return cases


@functools.cache
def _backends(specs: tuple[str, ...]) -> dict:
    from parity.runner import build_backends

    return build_backends(list(specs))


def _fmt(x) -> str:
    return "nan/inf" if x is None else f"{x:.3g}"


def explain(case, records: dict[str, dict], gate: dict | None) -> list[str]:
    """One paragraph per problem: tensor, both epsilons, tolerance, bound, worst element,
    where each side ran, and the command that reproduces just this case."""
    from parity.compare import describe_localisation

    ref = records.get(REFERENCE)
    problems = []
    for name, rec in records.items():
        if rec["side"] == "oracle":
            continue
        where = f"{name} ran on {rec.get('platform') or '?'}"
        if rec["status"] in ("error", "timeout"):
            error = (rec.get("error") or "").strip()[:1500]
            problems.append(f"[{name}] {rec['status']}: {error}\n  {where}\n  repro: {rec['repro']}")
            continue
        if rec["side"] == "reference":  # its tensors' verdicts are findings, not failures
            continue
        for tname, t in rec.get("tensors", {}).items():
            bound_entry = None
            if gate and rec["side"] == "candidate":
                for c in gate["cases"]:
                    if c["candidate"] == name:
                        bound_entry = c["tensors"].get(tname)
            verdict = (bound_entry or t)["verdict"] if bound_entry else t["verdict"]
            if verdict in ("pass", "unsupported"):
                continue
            rt = (ref or {}).get("tensors", {}).get(tname, {})
            w = (t.get("worst") or [{}])[0]
            b = (bound_entry or {}).get("bound") or {}
            rr = b.get("rel_rms") or {}
            localisation = (bound_entry or {}).get("localisation") or t.get("localisation")
            eps = f"  eps_{name} (rel_rms) = {_fmt(t.get('rel_rms'))}   eps_{REFERENCE} = {_fmt(rt.get('rel_rms'))}"
            eps += f"   tol = {_fmt(t.get('tol'))}"
            if rr:
                eps += f"   bound limit = {_fmt(rr.get('limit'))} (factor {b.get('factor')})"
            lines = [
                f"[{name}] {tname}: {verdict}",
                eps,
                f"  max_abs = {_fmt(t.get('max_abs'))}  nan = {t.get('nan')}  inf = {t.get('inf')}",
                f"  worst index {w.get('index')}: value {w.get('value')} oracle {w.get('oracle')}",
                f"  localisation: {describe_localisation(localisation) or '-'}",
                f"  {where}; {REFERENCE} ran on {(ref or {}).get('platform') or 'n/a'}",
                f"  repro: {rec['repro']}",
            ]
            problems.append("\n".join(lines))
    return problems


def reference_findings(case, records: dict[str, dict]) -> list[str]:
    """The reference's own tensors outside tolerance or non-finite: reported, never a test
    failure (the gate then bounds nothing with a non-finite reference tensor)."""
    out = []
    for name, rec in records.items():
        if rec["side"] != "reference":
            continue
        for tname, t in rec.get("tensors", {}).items():
            if t.get("verdict") in ("fail-accuracy", "nan-inf"):
                w = (t.get("worst") or [{}])[0]
                out.append(
                    f"{case.id}: reference {name} {tname} {t['verdict']} (rel_rms {_fmt(t.get('rel_rms'))}, "
                    f"tol {_fmt(t.get('tol'))}, nan {t.get('nan')}, inf {t.get('inf')}, worst index "
                    f"{w.get('index')}) on {rec.get('platform')}"
                )
    return out


def check_case(
    case,
    mode: str,
    specs: list[str],
    report_dir: Path,
    run_id: str,
    factor: float,
    tpu_targets: tuple[str, ...] = (),
) -> tuple[list[str], str | None, list[str]]:
    """Run `case` through the backend `specs` of a marker, compiling its jax candidates for
    `tpu_targets`; returns (problems, why no candidate could run it or None, findings about
    the reference)."""
    from parity.gate import GateRefusal, compile_problems, evaluate
    from parity.runner import run_case

    recs, _, compiles = run_case(case, specs, _backends(tuple(specs)), report_dir, run_id, tpu_targets=tpu_targets)
    by_backend = {r["backend"]: r for r in recs}
    gate = None
    if REFERENCE in by_backend and any(r["side"] == "candidate" for r in recs):
        try:
            gate = evaluate({case.id: by_backend}, factor)
        except GateRefusal:
            gate = None
    cands = [r for r in recs if r["side"] == "candidate"]
    problems = explain(case, by_backend, gate) + [
        f"[{c['backend']}] {c['verdict']}: {line}\n  repro: {c['repro']}"
        for c in compiles
        for line in compile_problems(c)
    ]
    no_kernel = None
    if cands and all(r["status"] == "unsupported" for r in cands):
        no_kernel = "; ".join(f"{r['backend']}: {r.get('error')}" for r in cands)
    return problems, no_kernel, reference_findings(case, by_backend)


def write_session_manifests(items, config, run_id: str) -> list[Path]:
    """One manifest per marker (parity.manifest) listing the cases and backends the selected
    parity tests are meant to write under the report dir, so that `parity gate` refuses the
    directory when a test was skipped or never ran. Written at collection (each xdist worker
    writes the same file); nothing when no parity test is selected."""
    by_mode: dict[str, list[str]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "parity_case" not in callspec.params:
            continue
        mode = next((m for m in MODE_BACKENDS if item.get_closest_marker(m)), None)
        if mode:
            by_mode.setdefault(mode, []).append(callspec.params["parity_case"].id)
    if not by_mode:
        return []
    from parity.backends import backend_name
    from parity.manifest import write_manifest

    paths = []
    for mode, ids in by_mode.items():
        specs = session_specs(config, mode)
        paths.append(
            write_manifest(
                _report_dir(config),
                f"{run_id}-{mode}",
                "pytest",
                list(dict.fromkeys(ids)),
                [backend_name(s) for s in specs],
                tpu_targets=_session_targets(config, mode),
            )
        )
    return paths


def session_gate(report_dir: Path, run_id: str, factor: float) -> tuple[str, bool | None]:
    """Gate over this session's records: (text, ok). The cases with both the reference and a
    candidate are gated; a session with one side only (gpu: the reference; tpu: the candidates,
    each already held to its tolerance by its test) leaves the bound to `parity gate` over both
    machines' directories: ok None, as when the session wrote nothing (text '')."""
    from collections import defaultdict

    from parity.gate import GateRefusal, evaluate, format_summary
    from parity.records import iter_results, write_json

    by_case: dict = defaultdict(dict)
    compiles: dict = defaultdict(dict)
    for _, rec in iter_results([report_dir]):
        if rec.get("run_id") == run_id:
            by_case[rec["case_id"]][rec["backend"]] = rec
    for _, rec in iter_results([report_dir], kind="compile"):
        if rec.get("run_id") == run_id:
            compiles[rec["case_id"]][rec["backend"]] = rec
    if not by_case:
        return "", None
    sides = {rec["side"] for recs in by_case.values() for rec in recs.values()}
    by_case = {c: recs for c, recs in by_case.items() if REFERENCE in recs and _has_candidate(recs)}
    if not by_case:
        wrote = "the reference" if "reference" in sides else "candidates" if "candidate" in sides else "the oracle"
        return (
            f"parity gate: not run: this session wrote {wrote} only; the bound needs both sides: "
            f"parity gate {report_dir} <the other side's report dir>"
        ), None
    try:
        result = evaluate(by_case, factor, compiles={c: v for c, v in compiles.items() if c in by_case})
    except GateRefusal as e:  # what the gate cannot compare is never a pass
        return f"parity gate: refused: {e}", False
    write_json(Path(report_dir) / "gate.json", result)
    return format_summary(result), result["ok"]


def _has_candidate(recs: dict[str, dict]) -> bool:
    return any(r["side"] == "candidate" for r in recs.values())
