"""The example cross-machine workflows (this checkout's and examples/') parse and their
commands match the CLI, the markers and the plugin's options."""

import shlex
from pathlib import Path

import pytest
import yaml

from parity.cli import build_parser

ROOT = Path(__file__).parents[1]
WORKFLOWS = [ROOT / ".github/workflows/parity-gate.yml", ROOT / "examples/.github/workflows/parity.yml"]


def _runs(job):
    return [s["run"] for s in job["steps"] if "run" in s]


def _option(argv: list[str], name: str) -> str:
    """The value of `name VALUE` or `name=VALUE` in argv."""
    for i, a in enumerate(argv):
        if a == name:
            return argv[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1 :]
    raise AssertionError(f"{name} not in {argv}")


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_jobs_dependencies_and_commands(workflow, pytestconfig):
    wf = yaml.safe_load(workflow.read_text())
    jobs = wf["jobs"]
    assert set(jobs) == {"gpu", "tpu", "gate"}
    assert sorted(jobs["gate"]["needs"]) == ["gpu", "tpu"]
    for marker in ("gpu", "tpu"):
        pytest_cmd = next(r for r in _runs(jobs[marker]) if "pytest" in r)
        argv = shlex.split(pytest_cmd)
        assert argv[:3] == ["python", "-m", "pytest"]
        assert argv[argv.index("-m", 3) + 1] == marker
        report_dir = _option(argv, "--parity-report-dir")
        for option in (a.split("=")[0] for a in argv[3:] if a.startswith("--")):
            pytestconfig.getoption(option)  # raises ValueError for an option no plugin registered
        upload = next(s for s in jobs[marker]["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
        assert upload["with"]["path"] == report_dir
    downloads = [
        s["with"]["path"] for s in jobs["gate"]["steps"] if s.get("uses", "").startswith("actions/download-artifact")
    ]
    parser = build_parser()
    for cmd in _runs(jobs["gate"]):
        argv = shlex.split(cmd)
        if argv[0] != "parity":
            continue
        args = parser.parse_args(argv[1:])  # raises SystemExit if the CLI does not accept it
        assert sorted(args.dirs) == sorted(downloads)
    assert any(shlex.split(c)[:2] == ["parity", "gate"] for c in _runs(jobs["gate"]))
    assert any(shlex.split(c)[:2] == ["parity", "report"] for c in _runs(jobs["gate"]))


def test_pytest_options_used_by_the_workflows_exist(pytestconfig):
    for opt in ("suite", "report_dir", "bound_factor", "candidate", "op", "cases", "backends", "tpu_targets"):
        pytestconfig.getoption("parity_" + opt)
