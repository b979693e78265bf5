"""SIGTERM and Ctrl-C at any phase of `parity run`, `parity gate` and a pytest session: the
interrupted message and what was kept, exit 143 or 130, never an internal error or a traceback
(parity.execute.interrupts). Each test sends the signal as one phase begins: in this process for
`parity` (parity.cli.main, the command's own code), in a process of its own for SIGINT and pytest
(tests/signal_at.py); tests/test_fail_closed.py sends it from outside while the workers run."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cases import Case
from parity.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = Case("simple_gla", 1, 16, 1, 16, 16, chunk_size=16, direction="fwd")


def _signalled(tmp_path: Path, sig: str, phase: str, command: str, *args: str) -> subprocess.CompletedProcess:
    """`command ARGS` in a process of its own, the signal sent as `phase` begins (tests/signal_at.py)."""
    return subprocess.run(
        [sys.executable, "-m", "tests.signal_at", sig, phase, command, *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _parity(monkeypatch, capsys, phase: str, *args: str) -> tuple[int, str]:
    """`parity ARGS` in this process (parity.cli.main, as the command runs it), SIGTERM sent to this
    process as `phase` begins: (exit status, stderr); nothing on either stream looks like a crash."""
    module, attr = phase.split(":")
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    original, sent = getattr(owner, name), []

    def at_phase(*a, **kw):
        if not sent:
            sent.append(phase)
            os.kill(os.getpid(), signal.SIGTERM)  # handled at once, here
        return original(*a, **kw)

    monkeypatch.setattr(owner, name, at_phase)
    rc = main(list(args))
    out, err = capsys.readouterr()
    assert sent and "internal error" not in out + err and "Traceback" not in out + err, out + err
    return rc, err


# (the function that starts a phase of `parity run`, what the run has kept when it is interrupted there)
RUN_PHASES = [
    ("parity.execute.pool:WorkerPool.start", "records for 0 of 1 cases"),  # FLA's lanes are up, the workers start
    ("parity.execute.runner:_Units.take", "records for 0 of 1 cases"),  # the first result comes back
    ("parity.execute.runner:Progress.close", "records for 1 of 1 cases"),  # the run loop ends
    ("parity.cli.run:judge_run", "the records of all 1 cases in"),  # the run is complete, not judged
    ("parity.cli.run:print_table", "the records of all 1 cases in"),
    ("parity.cli.run:write_report", "the records of all 1 cases in"),  # only the page is left
]


@pytest.mark.parametrize("phase, kept", RUN_PHASES, ids=[p.split(":")[1] for p, _ in RUN_PHASES])
def test_sigterm_at_any_phase_of_parity_run_is_an_interrupt_that_says_what_was_kept(
    tmp_path, monkeypatch, capsys, phase, kept
):
    out = tmp_path / "out"
    rc, err = _parity(monkeypatch, capsys, phase, "run", "--case", TINY.id, "--backends", "oracle", "--out", str(out))
    lines = [line for line in err.splitlines() if "parity run: interrupted by SIGTERM" in line]
    assert rc == 143 and len(lines) == 1 and kept in lines[0], err
    (manifest,) = out.glob("manifest-*.json")  # what the run meant to write: the gate reads it
    assert json.loads(manifest.read_text())["finished"] == kept.startswith("the records of all")


def test_sigterm_while_parity_gate_judges_is_an_interrupt(tmp_path, monkeypatch, capsys):
    assert main(["run", "--case", TINY.id, "--backends", "oracle", "--out", str(tmp_path), "--no-html"]) == 0
    rc, err = _parity(monkeypatch, capsys, "parity.cli.gate:run_gate", "gate", str(tmp_path))
    assert rc == 143 and err.strip().splitlines()[-1] == "parity gate: interrupted by SIGTERM", err


def test_ctrl_c_as_the_run_loop_ends_is_an_interrupt(tmp_path):
    """SIGINT from the terminal (a process of its own: Python's own Ctrl-C handler) as the progress line closes."""
    args = ("run", "--case", TINY.id, "--backends", "oracle", "--out", str(tmp_path / "out"))
    done = subprocess.run(
        [sys.executable, "-m", "tests.signal_at", "SIGINT", "parity.execute.runner:Progress.close", "parity", *args],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
        # SIGINT deliverable as from a terminal (a session started in the background ignores it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert "parity run: interrupted by SIGINT: records for 1 of 1 cases" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr


TEST_MODULE = """
import pytest


@pytest.mark.interpret
def test_interpret(parity_case, parity_check):
    parity_check(parity_case, "interpret")
"""


@pytest.mark.parametrize("phase", ["parity.pytest_plugin:check_case", "parity.pytest_plugin:session_gate"])
def test_a_signal_during_a_pytest_session_ends_it_as_interrupted_with_its_records_kept(tmp_path, phase):
    (tmp_path / "test_mine.py").write_text(TEST_MODULE)
    (tmp_path / "cases.json").write_text(json.dumps([TINY.id]))
    args = ["-p", "no:cacheprovider", "-q", "-m", "interpret", "--parity-cases=cases.json", "--parity-backends=oracle",
            "--parity-tpu-targets=none", "--parity-report-dir=out", "test_mine.py"]  # fmt: skip
    done = _signalled(tmp_path, "SIGTERM", phase, "pytest", *args)
    assert done.returncode == 143, done.stdout + done.stderr
    both = done.stdout + done.stderr
    assert "INTERNALERROR" not in both and "Traceback" not in both, both
    assert "interrupted by SIGTERM: the records of the tests that ran are in out" in done.stdout, done.stdout
