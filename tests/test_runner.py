"""`parity run`: fault isolation, candidates, records, shards, the oracle cache, bad input."""
import json
import shutil

import pytest

from cases import Case, get_suite, make_inputs
from parity.backends.oracle import cache_path, cached_oracle
from parity.cli import main
from parity.runner import shard

from .helpers import SMALL, run

CANDIDATES = {
    "scan": "scan=jax:tests.example_candidates:recurrent_scan",
    "boom": "boom=jax:tests.example_candidates:raises",
    "nan": "nan=jax:tests.example_candidates:returns_nan",
    "hang": "hang=jax:tests.example_candidates:never_returns",
}


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cases = [SMALL, Case("kda", 1, 40, 1, 64, 64, seqlens=(17, 23), ht=True)]
    summary = run(cases, ["oracle"] + list(CANDIDATES.values()), out, jobs=2, timeout_s=20)
    return out, cases, summary


def _rec(out, backend, case):
    return json.loads((out / backend / f"{case.id}.json").read_text())


def test_every_case_and_backend_gets_a_record(faulty_run):
    out, cases, summary = faulty_run
    assert len(summary["results"]) == len(cases) * (1 + len(CANDIDATES))
    for c in cases:
        for b in ["oracle", *CANDIDATES]:
            rec = _rec(out, b, c)
            assert rec["schema"] == 1 and rec["case_id"] == c.id and rec["input_hash"]


def test_failures_are_recorded_without_stopping_the_run(faulty_run):
    out, cases, _ = faulty_run
    for c in cases:
        assert _rec(out, "boom", c)["status"] == "error" and "deliberate failure" in _rec(out, "boom", c)["error"]
        nan = _rec(out, "nan", c)
        assert nan["verdict"] == "nan-inf" and nan["tensors"]["o"]["nan"] > 0
        hang = _rec(out, "hang", c)
        assert hang["status"] == "timeout" and "killed" in hang["error"]
        assert _rec(out, "scan", c)["status"] == "ok"   # ran after the hang in the same case


def test_a_correct_candidate_matches_the_oracle(faulty_run):
    out, cases, _ = faulty_run
    for c in cases:
        rec = _rec(out, "scan", c)
        assert rec["verdict"] == "pass", rec["tensors"]
        assert rec["platform"] == "cpu:tpu-interpret"   # an emulator is never called a TPU
        assert set(rec["tensors"]) == set(c.output_names())
        assert "parity run --case" in rec["repro"] and "--candidate" in rec["repro"]


def test_shards_are_disjoint_and_cover():
    cases = get_suite("ci")
    parts = [shard(cases, i, 3) for i in (1, 2, 3)]
    ids = [c.id for p in parts for c in p]
    assert len(ids) == len(set(ids)) == len(cases)
    assert [c.id for c in shard(list(reversed(cases)), 2, 3)] == [c.id for c in parts[1]]


def test_oracle_cache_is_reused_from_a_copied_directory(tmp_path, monkeypatch):
    c = SMALL.replace(seed=3)
    x = make_inputs(c)
    monkeypatch.setenv("PARITY_CACHE", str(tmp_path / "machine_a"))
    cold, hit, _ = cached_oracle(c, x)
    assert not hit and cache_path(c, x).exists()
    shutil.copytree(tmp_path / "machine_a", tmp_path / "machine_b")
    monkeypatch.setenv("PARITY_CACHE", str(tmp_path / "machine_b"))
    warm, hit, _ = cached_oracle(c, x)
    assert hit and all((warm[n] == cold[n]).all() for n in cold)


@pytest.mark.parametrize("argv, message", [
    (["run", "--suite", "nope"], "unknown suite 'nope'"),
    (["run", "--suite", "smoke", "--op", "mamba"], "unknown op 'mamba'"),
    (["run", "--suite", "smoke", "--backends", "oracle,cuda"], "unknown backend 'cuda'"),
    (["run", "--suite", "smoke", "--candidate", "x=mlx:m:f"], "FRAMEWORK 'mlx'"),
    (["run", "--suite", "smoke", "--candidate", "nonsense"], "NAME=FRAMEWORK:MODULE:FUNCTION"),
    (["run", "--suite", "smoke", "--candidate", "x=jax:no_such_module:f"], "cannot import module 'no_such_module'"),
    (["run", "--suite", "smoke", "--candidate", "x=jax:tests.example_candidates:nope"], "has no function 'nope'"),
    (["run", "--suite", "smoke", "--shard", "4/3"], "1 <= I <= N"),
    (["cases", "--case", "x"], "unrecognized"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    try:
        rc = main(argv + (["--out", str(tmp_path / "o")] if argv[0] == "run" else []))
    except SystemExit as e:   # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err
    assert not (tmp_path / "o").exists()   # nothing ran


def test_cases_command_json(capsys):
    assert main(["cases", "--suite", "smoke", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [Case.from_dict(d).id for d in listed] == [c.id for c in get_suite("smoke")]


def test_repro_writes_a_standalone_script_that_reproduces_the_epsilons(tmp_path, faulty_run):
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path
    out, cases, _ = faulty_run
    case = cases[1]
    spec = CANDIDATES["scan"]
    assert main(["repro", case.id, "--candidate", spec, "-o", str(tmp_path / "r")]) == 0
    script = (tmp_path / "r" / "repro.py").read_text()
    assert "import parity" not in script and "from parity" not in script   # standalone
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}  # only for the example kernel's module
    printed = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "r", env=env, capture_output=True,
                             text=True, check=True).stdout
    rec = _rec(out, "scan", case)
    for name, t in rec["tensors"].items():
        m = re.search(rf"^\s+{name}\s+rel_rms (\S+)", printed, re.M)
        assert m and float(m.group(1)) == pytest.approx(t["rel_rms"], rel=1e-3), (name, printed)
