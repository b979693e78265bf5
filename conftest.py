"""The pytest plugin: markers, options, registry-driven parity tests, the session gate.

Thin by design: the logic lives in parity/pytest_support.py.
    pytest -m interpret --suite smoke     FLA and Pallas through their CPU interpreters
    pytest -m gpu --suite ci              FLA compiled on CUDA
    pytest -m tpu --suite ci              Pallas compiled on TPU
interpret and tpu tests also compile their jax candidates for TPU targets (--tpu-targets).
"""
from __future__ import annotations

import functools
import os
import uuid
import warnings
from pathlib import Path

import pytest

MARKERS = {
    "gpu": "FLA Triton kernels compiled on a CUDA GPU",
    "tpu": "kernels_jax Pallas kernels compiled on a TPU",
    "interpret": "FLA and Pallas kernels through their CPU interpreters (Triton interpreter, TPU interpret mode)",
    "slow": "long-running; excluded from the default unit-test pass",
}


class ReferenceFinding(UserWarning):
    """FLA (the reference) outside its own tolerance or non-finite: a finding, not a failure."""


def pytest_addoption(parser):
    g = parser.getgroup("parity")
    g.addoption("--suite", default=None, help="case suite for the parity tests (default smoke)")
    g.addoption("--cases", dest="parity_cases_file", default=None, help="JSON file of case dicts or ids")
    g.addoption("--op", default=None, help="only cases of this op")
    g.addoption("--report-dir", default="reports/pytest", help="where parity tests write their records")
    g.addoption("--candidate", action="append", default=[], help="NAME=FRAMEWORK:MODULE:FUNCTION (repeatable)")
    g.addoption("--bound-factor", type=float, default=1.0, help="eps_candidate <= F * eps_reference + floor")
    g.addoption("--parity-fuzz", dest="parity_fuzz", type=float, default=None, metavar="SECONDS",
                help="run tests/test_fuzz.py::test_fuzz_search: parity fuzz of each op for SECONDS against pallas "
                     "(or the first --candidate)")
    g.addoption("--tpu-targets", default=None,
                help="compile the jax candidates of interpret and tpu tests for these TPU targets (v4, v5e, v5p, "
                     "v6e, tpu7x) or 'none'; default v5e,v6e,tpu7x where libtpu is installed and no TPU is attached")


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    # one id for the whole session, inherited by xdist workers through the environment
    os.environ.setdefault("PARITY_RUN_ID", "pytest-" + uuid.uuid4().hex[:10])
    if _cuda_missing():
        # FLA's kernels must be built for the Triton interpreter: ask before any test imports fla
        from parity.backends import triton_interpreter
        triton_interpreter.request()


def pytest_generate_tests(metafunc):
    if "parity_case" in metafunc.fixturenames:
        from parity.pytest_support import select_cases
        opt = metafunc.config.getoption
        cases = select_cases(opt("suite"), opt("parity_cases_file"), opt("op"))
        metafunc.parametrize("parity_case", cases, ids=[c.id for c in cases])


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


@functools.cache
def _tpu_targets(text: str | None) -> tuple[str, ...]:
    from parity.tpu_compile import parse_targets
    try:
        return parse_targets(text)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") and _cuda_missing():
        pytest.skip(_cuda_missing())
    if item.get_closest_marker("tpu") and _tpu_missing():
        pytest.skip(_tpu_missing())


@pytest.fixture
def parity_check(request):
    """parity_check(case, mode): run the case for a marker and fail with the full explanation."""
    from parity.pytest_support import check_case
    opt = request.config.getoption

    def check(case, mode):
        problems, no_kernel, findings = check_case(case, mode, opt("candidate"), Path(opt("report_dir")),
                                                   os.environ["PARITY_RUN_ID"], opt("bound_factor"),
                                                   _tpu_targets(opt("tpu_targets")))
        for f in findings:
            warnings.warn(ReferenceFinding(f))
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)
        if no_kernel:  # not a pass: the kernel is an open issue
            pytest.xfail(f"no candidate kernel for this case: {no_kernel}")
    return check


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # xdist worker: the controller gates
        return
    from parity.pytest_support import session_gate
    opt = session.config.getoption
    report_dir = Path(opt("report_dir"))
    if not report_dir.exists():
        return
    text, ok = session_gate(report_dir, os.environ["PARITY_RUN_ID"], opt("bound_factor"))
    if ok is None:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.write_sep("=", "parity gate")
        reporter.write_line(text)
    if not ok and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_collection_finish(session):
    """The manifest of what the selected parity tests will write (parity gate refuses what is missing)."""
    from parity.pytest_support import write_session_manifests
    opt = session.config.getoption
    write_session_manifests(session.items, opt("candidate"), Path(opt("report_dir")), os.environ["PARITY_RUN_ID"],
                            _tpu_targets(opt("tpu_targets")))
