"""The example cross-machine workflow parses and its commands match the CLI and markers."""
import shlex
from pathlib import Path

import yaml

from parity.cli import build_parser

WORKFLOW = Path(__file__).parents[1] / ".github/workflows/parity-gate.yml"


def _runs(job):
    return [s["run"] for s in job["steps"] if "run" in s]


def test_workflow_jobs_dependencies_and_commands():
    wf = yaml.safe_load(WORKFLOW.read_text())
    jobs = wf["jobs"]
    assert set(jobs) == {"gpu", "tpu", "gate"}
    assert sorted(jobs["gate"]["needs"]) == ["gpu", "tpu"]
    for marker in ("gpu", "tpu"):
        pytest_cmd = next(r for r in _runs(jobs[marker]) if "pytest" in r)
        argv = shlex.split(pytest_cmd)
        assert argv[:3] == ["python", "-m", "pytest"]
        assert argv[argv.index("-m", 3) + 1] == marker
        report_dir = argv[argv.index("--report-dir") + 1]
        upload = next(s for s in jobs[marker]["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
        assert upload["with"]["path"] == report_dir
    downloads = [s["with"]["path"] for s in jobs["gate"]["steps"] if s.get("uses", "").startswith("actions/download-artifact")]
    parser = build_parser()
    for cmd in _runs(jobs["gate"]):
        argv = shlex.split(cmd)
        if argv[0] != "parity":
            continue
        args = parser.parse_args(argv[1:])   # raises SystemExit if the CLI does not accept it
        assert sorted(args.dirs) == sorted(downloads)
    assert any(shlex.split(c)[:2] == ["parity", "gate"] for c in _runs(jobs["gate"]))
    assert any(shlex.split(c)[:2] == ["parity", "report"] for c in _runs(jobs["gate"]))


def test_pytest_options_used_by_the_workflow_exist(pytestconfig):
    for opt in ("suite", "report_dir", "bound_factor", "candidate", "op", "parity_cases_file"):
        pytestconfig.getoption(opt)
