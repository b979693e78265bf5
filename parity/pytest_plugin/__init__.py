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
records is printed in the terminal summary and fails the session when it fails. A reference
its environment refused (FLA on Hopper with Triton < 3.7.1: fla#640) or left known wrong fails
the test and the session gate, naming cause and fix, unless `--parity-allow-unbounded-reference`
(then a ReferenceFinding warning), as `parity gate` does.

Only the standard library, pytest, parity.model and parity.execute.interrupts (SIGTERM ends a
session as Ctrl-C does: exit 143, or 130) are imported at startup (here and in the submodules
below): jax, torch, fla and the harness are imported inside the functions the hooks call when
parity tests run, so the plugin costs nothing in other test suites.
Where no CUDA device exists it sets TRITON_INTERPRET=1 at configure (FLA's kernels must be
built for the Triton interpreter before fla is first imported).

This module holds the hooks and the fixture; what they call: options (the `--parity-*`
options), devices (CUDA and TPU probes), checks (a case through a marker's backends and the
explanation of what failed), session (the manifests and the session gate) and fuzz
(`--parity-fuzz`, run by tests/test_fuzz.py::test_fuzz_search).
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings

import pytest

from parity.execute import interrupts
from parity.model import environ, gpu
from parity.model.host import keep_jax_on_the_cpu
from parity.pytest_plugin.checks import check_case, explain, reference_findings, select_cases
from parity.pytest_plugin.devices import cuda_missing, no_cuda_device, tpu_missing
from parity.pytest_plugin.options import (
    DEFAULT_REPORT_DIR,
    MODE_BACKENDS,
    add_options,
    allow_unbounded_reference,
    bound_factor,
    fla_settings,
    fresh,
    refuse_bad_options,
    report_dir,
    selected_cases,
    session_specs,
    session_targets,
)
from parity.pytest_plugin.session import session_gate, write_session_manifests

MARKERS = {
    "gpu": "FLA Triton kernels compiled on a CUDA GPU",
    "tpu": "kernels_jax Pallas kernels compiled on a TPU",
    "interpret": "FLA and Pallas kernels through their CPU interpreters (Triton interpreter, TPU interpret mode)",
    "slow": "long-running; excluded from the default unit-test pass",
}
_GATE = pytest.StashKey[tuple[str, bool]]()
_SESSION = pytest.StashKey[contextlib.ExitStack]()  # what the session exports and starts; undone at unconfigure
_LANES = pytest.StashKey[object]()  # FLA's lanes the controller started (fla_lane.Lanes)
_INTERRUPTED: list[str] = []  # the signal that interrupted this session (SIGINT or SIGTERM), if one did
_TUNED = pytest.StashKey[object]()  # the table --parity-fla-autotune wrote (fla_configs.write_tuned_table)


class ReferenceFinding(UserWarning):
    """FLA (the reference) outside its own tolerance or non-finite: a finding, not a failure."""


# ---------------------------------------------------------------------------------------- hooks


def pytest_addoption(parser):
    add_options(parser)


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    refuse_bad_options(config)
    # one id for the whole session, inherited by xdist workers through the environment
    os.environ.setdefault("PARITY_RUN_ID", "pytest-" + uuid.uuid4().hex[:10])
    # --parity-fresh: every cache lookup of the session's processes misses; put back at the end
    config.stash[_SESSION] = session = contextlib.ExitStack()
    session.enter_context(interrupts.terminated_as_interrupt())  # SIGTERM ends the session as Ctrl-C does
    if fresh(config):
        session.enter_context(environ.exported({environ.FRESH: "1"}))
    if no_cuda_device():
        # FLA's kernels must be built for the Triton interpreter, with an H100's tiles: ask before
        # any test imports fla (what triton_interpreter.request() does, without importing the harness)
        gpu.interpret_as_an_h100()
    if any(m in (config.getoption("markexpr") or "") for m in ("gpu", "interpret")):
        keep_jax_on_the_cpu()  # the candidates run in TPU interpret mode on the CPU, not in a GPU's jax
    if not hasattr(config, "workerinput"):  # the controller: xdist workers inherit the lanes' addresses
        _start_fla_lanes(config, session)


def _start_fla_lanes(config, session: contextlib.ExitStack) -> None:
    """FLA's lanes for the session's workers (parity.execute.backends.fla_lane; none on a host without a CUDA GPU
    unless --parity-fla-lanes asks: as `parity run`, one per GPU, the session's cases pre-compiled on every
    core while they start), and FLA's configs (--parity-fla-configs, --parity-fla-autotune) in the environment,
    both entered into `session`."""
    lanes, fallback, configs, autotune = fla_settings(config)
    values = {} if configs is None else {environ.FLA_CONFIGS: str(configs)}
    if autotune:
        values[environ.FLA_AUTOTUNE] = "1"
    session.enter_context(environ.exported(values))
    if lanes == 0 or (lanes is None and no_cuda_device()):
        return
    from parity.execute.backends import fla_lane  # late: only where lanes run

    cases = selected_cases(config) if "gpu" in (config.getoption("markexpr") or "") else []
    config.stash[_LANES] = session.enter_context(fla_lane.started(True, lanes, fallback, cases))


def pytest_unconfigure(config):
    config.stash.get(_SESSION, contextlib.ExitStack()).close()


def pytest_generate_tests(metafunc):
    if "parity_case" in metafunc.fixturenames:
        cases = selected_cases(metafunc.config)
        metafunc.parametrize("parity_case", cases, ids=[c.id for c in cases])


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") and cuda_missing():
        pytest.skip(cuda_missing())
    if item.get_closest_marker("tpu") and tpu_missing():
        pytest.skip(tpu_missing())


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
            report_dir(config),
            os.environ["PARITY_RUN_ID"],
            bound_factor(config),
            session_targets(config, mode),
            allow_unbounded_reference(config),
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


def pytest_keyboard_interrupt(excinfo):
    name = interrupts.signal_of(excinfo.value)  # not pytest-xdist's own stop at --maxfail
    if name is not None:
        _INTERRUPTED.append(name)


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # xdist worker: the controller gates
        return
    out = report_dir(session.config)
    try:
        if not _INTERRUPTED:
            _gate_session(session, out)
    except KeyboardInterrupt as e:  # while gating
        _INTERRUPTED.append(interrupts.signal_name(e))
    if _INTERRUPTED:  # the records of the tests that ran are kept; the gate would refuse the rest missing
        session.exitstatus = interrupts.exit_status(_INTERRUPTED[-1])
        session.config.stash[_GATE] = (
            f"interrupted by {_INTERRUPTED[-1]}: the records of the tests that ran are in {out}; not gated "
            f"(parity gate {out} refuses them until every selected test has run)",
            False,
        )


def _gate_session(session, out) -> None:
    """The gate over the session's records, and with --parity-fla-autotune the table of what Triton chose."""
    if not out.exists():
        return
    text, ok = session_gate(
        out, os.environ["PARITY_RUN_ID"], bound_factor(session.config), allow_unbounded_reference(session.config)
    )
    if text:
        session.config.stash[_GATE] = (text, ok)
    if ok is False and session.exitstatus == 0:
        session.exitstatus = 1
    if fla_settings(session.config)[3]:  # --parity-fla-autotune: what Triton chose, as a table
        from parity.execute.backends import fla_configs  # late: only where FLA was tuned

        session.config.stash[_TUNED] = fla_configs.write_tuned_table(
            out, f"pytest session {os.environ['PARITY_RUN_ID']}"
        )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lanes = config.stash.get(_LANES, None)
    if lanes is not None and lanes.precompile is not None:
        terminalreporter.write_line(f"FLA pre-compile: {lanes.precompile.summary()}")
    if config.stash.get(_TUNED, None):
        tuned = config.stash[_TUNED]
        terminalreporter.write_line(
            f"FLA configs tuned: {tuned['keys']} keys of {tuned['kernels']} kernels in {tuned['table']} "
            f"(reuse: --parity-fla-configs {tuned['table']})"
        )
    gate = config.stash.get(_GATE, None)
    if gate is not None:
        terminalreporter.write_sep("=", "parity gate")
        terminalreporter.write_line(gate[0])


__all__ = [
    "MARKERS",
    "MODE_BACKENDS",
    "DEFAULT_REPORT_DIR",
    "ReferenceFinding",
    "check_case",
    "explain",
    "reference_findings",
    "select_cases",
    "session_specs",
    "session_gate",
    "write_session_manifests",
]
