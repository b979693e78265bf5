"""The pytest plugin (parity/pytest_plugin/): its options, markers and refusals in-process
through pytester; the manifests it writes at collection; end to end in a child pytest: a
planted failing candidate fails its parity test with the explanation and the repro command,
and hardware markers skip with a reason."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

# imported before pytester's in-process runs, which unload the modules they import (torch: the
# plugin asks it for CUDA where /dev/nvidia<N> exists; jax and Pallas TPU: the runs import them, and
# a second import in one process aborted it (jaxlib) or refused the next test's jax candidate
# ("PRNG with name pallas_tpu already registered") when test_fail_closed came next in the worker)
import jax  # noqa: F401
import jax.experimental.pallas.tpu  # noqa: F401
import pytest
import torch  # noqa: F401

import parity.execute.tpu_compile  # noqa: F401
import parity.judge.gate  # noqa: F401
import parity.records  # noqa: F401
import parity.records.manifest  # noqa: F401
from cases import OPS, get_suite, make_inputs
from parity.execute.backends.oracle import cached_oracle
from parity.records import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
CASE = "simple_gla-fwd-B1-T96-H2-K64-V64-fp32-C64-g_stress"  # a smoke case, forward only
OPTIONS = ["suite", "cases", "op", "max-elements", "max-bytes", "report-dir", "candidate", "backends", "bound-factor"]
OPTIONS += ["tpu-targets", "tpu-interpret-as", "allow-unbounded-reference"]
PARITY_TEST = """
import pytest

@pytest.mark.interpret
def test_interpret(parity_case, parity_check):
    parity_check(parity_case, "interpret")

@pytest.mark.gpu
def test_gpu(parity_case, parity_check):
    parity_check(parity_case, "gpu")
"""


@pytest.fixture
def plugged(pytester, monkeypatch):
    """pytester in-process with the plugin loaded by -p (entry points off: the same whether or
    not this checkout is installed)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return lambda *args: pytester.runpytest_inprocess("-p", "parity.pytest_plugin", "-p", "no:cacheprovider", *args)


def test_options_are_in_a_parity_group_with_the_parity_prefix_and_markers_are_registered(plugged):
    out = plugged("--help").stdout.str()
    group = out[out.index("linear-attention parity tests") :].split("\n\n")[0]
    for name in OPTIONS:
        assert f"--parity-{name}" in group, name
    assert "\n  --suite" not in out and "\n  --candidate" not in out  # no unprefixed options
    markers = plugged("--markers").stdout.str()
    for name in ("interpret", "gpu", "tpu", "slow"):
        assert f"@pytest.mark.{name}:" in markers


@pytest.mark.parametrize(
    "args, message",
    [
        (["--parity-suite", "nope"], "--parity-suite 'nope': unknown suite 'nope': expected one of ['smoke'"),
        (["--parity-op", "mamba"], f"--parity-op 'mamba': unknown op 'mamba': expected one of {list(OPS)}"),
        (["--parity-max-elements", "0"], "--parity-max-elements '0': expected an int >= 1"),
        (["--parity-op", "kda", "--parity-max-elements", "100"], "--parity-max-elements 100: case kda-"),
        (["--parity-suite", "smoke", "--parity-cases=c.json"], "expected exactly one of --parity-suite NAME"),
        (["--parity-bound-factor", "nan"], "--parity-bound-factor 'nan': expected a finite number >= 0"),
        (["--parity-bound-factor", "-1"], "--parity-bound-factor '-1': expected a finite number >= 0"),
        (["--parity-backends", "oracle,cuda"], "--parity-backends 'oracle,cuda': expected a comma-separated list"),
        (["--parity-candidate", "nonsense"], "--parity-candidate 'nonsense': expected NAME=FRAMEWORK:MODULE:FUNCTION"),
        (["--parity-tpu-targets", "v9"], "--parity-tpu-targets 'v9': 'v9' is not a target"),
        (["--parity-cases=missing.json"], "--parity-cases 'missing.json': expected a JSON file"),
        (["--parity-fla-lanes", "two"], "--parity-fla-lanes 'two': expected auto or an int >= 0"),
        (["--parity-fla-fallback", "gpu"], "--parity-fla-fallback 'gpu': expected none or interpreter"),
        (["--parity-fla-configs=missing.json"], "--parity-fla-configs 'missing.json':"),
    ],
)
def test_a_bad_option_is_one_line_naming_it_and_the_allowed_values(plugged, args, message):
    result = plugged("--co", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str(), result.stderr.str()


def test_a_path_pytest_took_for_the_rootdir_is_refused_with_the_spelling_that_works(plugged, pytester, tmp_path):
    elsewhere = tmp_path / "elsewhere"  # outside pytester's directory: the rootdir came from it
    (elsewhere / "r").mkdir(parents=True)
    result = plugged("--co", "--parity-report-dir", str(elsewhere / "r"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"write --parity-report-dir={elsewhere / 'r'}" in result.stderr.str()
    assert plugged("--co", f"--parity-report-dir={elsewhere / 'r'}").ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_collection_writes_one_manifest_per_marker_with_the_kept_backends_and_candidates(plugged, pytester):
    pytester.makepyfile(test_p=PARITY_TEST)
    result = plugged(
        "--co",
        "--parity-suite",
        "smoke",
        "--parity-op",
        "kda",
        "--parity-report-dir=r",
        "--parity-backends",
        "oracle,fla",
        "--parity-candidate",
        "mine=jax:mod:fn",
    )
    assert result.ret == pytest.ExitCode.OK
    manifests = {p.name.rsplit("-", 1)[1]: json.loads(p.read_text()) for p in (pytester.path / "r").glob("manifest-*")}
    kda = [c.id for c in get_suite("smoke") if c.op == "kda"]
    assert sorted(manifests) == ["gpu.json", "interpret.json"]
    assert manifests["interpret.json"]["backends"] == ["oracle", "fla", "mine"]  # no pallas: not kept
    assert manifests["gpu.json"]["backends"] == ["oracle", "fla"]  # the reference side runs no candidate
    assert [c["id"] for c in manifests["interpret.json"]["cases"]] == kda


def test_a_session_without_parity_tests_writes_and_gates_nothing(plugged, pytester):
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = plugged("--parity-report-dir=r")
    assert result.ret == pytest.ExitCode.OK
    assert "parity gate" not in result.stdout.str()
    assert not (pytester.path / "r").exists()


def test_a_session_without_parity_tests_imports_no_framework(pytester, monkeypatch):
    """The plugin is loaded in every pytest session of an environment that has the package:
    it must not import jax, torch, fla, triton or the harness unless parity tests run."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(
        "import sys\n"
        "def pytest_unconfigure(config):\n"
        "    heavy = {'jax', 'torch', 'fla', 'triton', 'numpy', 'cases', 'references', 'kernels_jax'}\n"
        "    names = sorted({m.split('.')[0] for m in sys.modules} & heavy)\n"
        "    # the plugin, and the model it reads names from (standard library)\n"
        "    light = ('parity.pytest_plugin', 'parity.pytest_plugin.options', 'parity.pytest_plugin.devices',\n"
        "             'parity.pytest_plugin.checks', 'parity.pytest_plugin.session',\n"
        "             'parity.model', 'parity.model.environ', 'parity.model.gpu', 'parity.model.host',\n"
        "             'parity.model.spec', 'parity.model.verdict', 'parity.model.options',\n"
        "             'parity.model.option_error', 'parity.execute', 'parity.execute.interrupts')\n"
        "    names += sorted(m for m in sys.modules if m.startswith('parity.') and m not in light)\n"
        "    open('imported.txt', 'w').write(' '.join(names))\n"
    )
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "parity.pytest_plugin", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    assert (pytester.path / "imported.txt").read_text() == ""


def test_entry_point_conftest_and_dash_p_together_register_it_once(pytester, monkeypatch):
    """The entry point is named like the module, so a conftest's pytest_plugins and -p that name
    it again find it registered (no 'Plugin already registered'); with the package installed
    (CI) this session loads it through all three."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makeconftest('pytest_plugins = ["parity.pytest_plugin"]')
    pytester.makepyfile(test_plain="def test_ok(parity_check):\n    pass\n")  # the plugin's fixture
    result = pytester.runpytest_subprocess("-p", "parity.pytest_plugin", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert '"parity.pytest_plugin" = "parity.pytest_plugin"' in (ROOT / "pyproject.toml").read_text()


def test_the_session_gate_bounds_what_has_both_sides_and_leaves_one_side_to_parity_gate(tmp_path):
    """gpu sessions write the reference only and tpu sessions the candidates only: not a gate
    failure (each candidate test already held its tensors to tolerance); with both, gated."""
    from parity.pytest_plugin import session_gate

    from .helpers import SMALL, perturbed, record_from_tensors, write_records

    oracle = cached_oracle(SMALL, make_inputs(SMALL))[0]
    fla_like = perturbed(SMALL, {n: oracle[n] * (1 + 1e-6) for n in SMALL.output_names()}, 1.0)
    ref = record_from_tensors(SMALL, "fla", "reference", fla_like)
    twice = record_from_tensors(SMALL, "mine", "candidate", perturbed(SMALL, fla_like, 3.0))
    for name, recs in (("gpu", [ref]), ("tpu", [twice])):
        write_records(tmp_path / name, *recs)
        text, ok = session_gate(tmp_path / name, "test", 1.0)
        assert ok is None and "not run" in text and f"parity gate {tmp_path / name}" in text
    (tmp_path / "nothing").mkdir()
    assert session_gate(tmp_path / "nothing", "test", 1.0) == ("", None)
    write_records(tmp_path / "both", ref, twice)
    text, ok = session_gate(tmp_path / "both", "test", 1.0)
    assert ok is False and "gate: FAIL" in text  # 3x the reference's error breaks the bound
    assert session_gate(tmp_path / "both", "test", 3.5)[1] is True
    assert session_gate(tmp_path / "both", "another-session", 1.0) == ("", None)
    # an earlier session's record of an older schema in the same report dir is not this session's
    old = {**ref, "schema": SCHEMA_VERSION - 1, "run_id": "an-older-session", "case_id": "x"}
    (tmp_path / "both" / "fla" / "older.json").write_text(json.dumps(old))
    assert session_gate(tmp_path / "both", "test", 3.5)[1] is True
    # this session's own unreadable record is refused in one line, never a pass
    (tmp_path / "both" / "fla" / "mine.json").write_text(json.dumps({**old, "run_id": "test"}))
    text, ok = session_gate(tmp_path / "both", "test", 3.5)
    assert ok is False and text.startswith("parity gate: refused:") and "schema" in text


def _pytest(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rs",
        "tests/test_parity.py",
        f"--parity-report-dir={tmp_path / 'reports'}",
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if k != "PARITY_RUN_ID"}  # a session of its own
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_planted_failing_candidate_fails_with_explanation_and_repro(tmp_path):
    spec = "planted=jax:tests.example_candidates:returns_nan"
    p = _pytest(
        "-m",
        "interpret",
        "--parity-suite",
        "smoke",
        "-k",
        CASE,
        "--parity-backends",
        "oracle,fla",
        "--parity-tpu-targets",
        "none",
        "--parity-candidate",
        spec,
        tmp_path=tmp_path,
    )
    assert p.returncode == 1, p.stdout[-3000:]
    out = p.stdout
    assert "[planted] o: nan-inf" in out
    assert re.search(r"\[planted\] o: nan-inf\n  decided by nan-inf: \d+ NaN and \d+ Inf where the oracle", out)
    assert f"repro: parity run --case {CASE}" in out and f"--candidate {spec}" in out
    assert "planted ran on cpu:tpu-interpret" in out and "fla ran on cpu:triton-interpreter" in out
    assert "parity gate" in out and "gate: FAIL" in out  # the session gate ran at the end
    assert out.index("parity gate") > out.index("[planted] o: nan-inf")  # in the terminal summary
    assert (tmp_path / "reports" / "planted" / f"{CASE}.json").exists()
    assert not (tmp_path / "reports" / "pallas").exists()  # --parity-backends kept oracle and fla only


def test_gpu_and_tpu_markers_skip_here_with_the_reason(tmp_path):
    for marker, reason in (("gpu", "no CUDA GPU visible to torch"), ("tpu", "no TPU visible to jax")):
        p = _pytest("-m", marker, "--parity-suite", "smoke", tmp_path=tmp_path)
        assert p.returncode == 0, p.stdout[-2000:]
        assert f"{len(get_suite('smoke'))} skipped" in p.stdout and reason in p.stdout


def test_a_session_runs_fla_through_its_lanes(tmp_path):
    """--parity-fla-lanes 1: the session's FLA calls go to one lane the controller started (here FLA in
    the interpreter), whose record says so, and the session passes as without it."""
    case = "simple_gla-fwdbwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig-h0-ht"
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([case]))
    p = _pytest(
        "-m", "interpret", "--parity-backends=oracle,fla", f"--parity-cases={cases}", "--parity-fla-lanes=1",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rec = json.loads((tmp_path / "reports" / "fla" / f"{case}.json").read_text())
    assert rec["status"] == "ok" and "FLA lane for cpu" in rec["notes"]["fla_lane"]
