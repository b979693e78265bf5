"""`parity run`: fault isolation, candidates, records, shards, the oracle cache, bad input."""

import json
import shutil

import pytest

from cases import Case, get_suite, make_inputs
from parity.cli import main
from parity.execute.backends.oracle import cache_path, cached_oracle
from parity.execute.runner import shard
from parity.records import SCHEMA_VERSION

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
            assert rec["schema"] == SCHEMA_VERSION and rec["case_id"] == c.id and rec["input_hash"]


def test_failures_are_recorded_without_stopping_the_run(faulty_run):
    out, cases, _ = faulty_run
    for c in cases:
        assert _rec(out, "boom", c)["status"] == "error" and "deliberate failure" in _rec(out, "boom", c)["error"]
        nan = _rec(out, "nan", c)
        assert nan["verdict"] == "nan-inf" and nan["tensors"]["o"]["nan"] > 0
        hang = _rec(out, "hang", c)
        assert hang["status"] == "timeout" and "killed" in hang["error"]
        assert _rec(out, "scan", c)["status"] == "ok"  # ran after the hang in the same case


def test_a_correct_candidate_matches_the_oracle(faulty_run):
    out, cases, _ = faulty_run
    for c in cases:
        rec = _rec(out, "scan", c)
        assert rec["verdict"] == "pass", rec["tensors"]
        assert rec["platform"] == "cpu:tpu-interpret"  # an emulator is never called a TPU
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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--suite", "nope"], "unknown suite 'nope'"),
        (["run", "--suite", "smoke", "--op", "mamba"], "unknown op 'mamba'"),
        (["run", "--suite", "smoke", "--backends", "oracle,cuda"], "unknown backend 'cuda'"),
        (["run", "--suite", "smoke", "--candidate", "x=mlx:m:f"], "FRAMEWORK 'mlx'"),
        (["run", "--suite", "smoke", "--candidate", "nonsense"], "NAME=FRAMEWORK:MODULE:FUNCTION"),
        (["run", "--suite", "smoke", "--candidate", "x=jax:no_such_module:f"], "cannot import module 'no_such_module'"),
        (["run", "--suite", "smoke", "--candidate", "x=jax:tests.example_candidates:nope"], "has no function 'nope'"),
        (["run", "--suite", "smoke", "--shard", "4/3"], "1 <= I <= N"),
        (["cases", "--case", "x"], "unrecognized"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    try:
        rc = main(argv + (["--out", str(tmp_path / "o")] if argv[0] == "run" else []))
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err
    assert not (tmp_path / "o").exists()  # nothing ran


def test_cases_command_json(capsys):
    assert main(["cases", "--suite", "smoke", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [Case.from_dict(d).id for d in listed] == [c.id for c in get_suite("smoke")]


def test_repro_writes_a_script_that_reproduces_the_epsilons_and_the_verdict(tmp_path, faulty_run):
    """Without a reference (--no-reference) the script judges the tolerance alone; the kernel's module
    (tests.example_candidates) is found by the script itself, with no PYTHONPATH set."""
    import os
    import re
    import subprocess
    import sys

    out, cases, _ = faulty_run
    case = cases[1]
    spec = CANDIDATES["scan"]
    assert main(["repro", case.id, "--candidate", spec, "-o", str(tmp_path / "r"), "--no-reference"]) == 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    printed = subprocess.run(
        [sys.executable, "repro.py"], cwd=tmp_path / "r", env=env, capture_output=True, text=True, check=True
    ).stdout
    rec = _rec(out, "scan", case)
    for name, t in rec["tensors"].items():
        m = re.search(rf"^\s+{name}\s+rel_rms (\S+)", printed, re.M)
        assert m and float(m.group(1)) == pytest.approx(t["rel_rms"], rel=1e-3), (name, printed)
    assert "bound: not judged" in printed and f"verdict: {rec['verdict']}" in printed, printed


GAMMA = Case("simple_gla", 1, 40, 2, 32, 32, gate="gamma_alibi", direction="fwd", h0=True, ht=True)
LOGSIG = Case("simple_gla", 1, 40, 2, 32, 32, gate="g_logsig", direction="fwd")


def test_a_candidate_says_what_it_does_not_support(tmp_path):
    """NotImplementedError("reason") and a supports(case) attribute -> `unsupported` with the
    reason, not an error; the gate lists them as unsupported and passes the rest."""
    from parity.judge.gate import evaluate, load

    from .helpers import record_from_tensors, write_records

    specs = [
        "raising=jax:tests.spec_candidates:gamma_only_raises",
        "asking=jax:tests.spec_candidates:gamma_only_supports",
    ]
    summary = run([GAMMA, LOGSIG], ["oracle", *specs], tmp_path, jobs=1, timeout_s=120)
    for name, reason in (
        ("raising", "only g_gamma gating, without varlen"),
        ("asking", "g_gamma gating only, without varlen"),
    ):
        rec = _rec(tmp_path, name, LOGSIG)
        assert (rec["status"], rec["verdict"], rec["error"]) == ("unsupported", "unsupported", reason)
        assert _rec(tmp_path, name, GAMMA)["verdict"] == "pass"
    assert all(r["verdict"] in ("pass", "unsupported") for r in summary["results"])
    for case in (GAMMA, LOGSIG):  # a reference 1e-5 off the oracle, for the gate
        oracle = cached_oracle(case, make_inputs(case))[0]
        write_records(
            tmp_path, record_from_tensors(case, "fla", "reference", {n: a * (1 + 1e-5) for n, a in oracle.items()})
        )
    gate = evaluate(load([tmp_path]))
    assert gate["ok"], gate["failures"]
    assert {(u["case_id"], u["candidate"]) for u in gate["unsupported"]} == {
        (LOGSIG.id, "raising"),
        (LOGSIG.id, "asking"),
    }


def test_a_supports_attribute_that_answers_nonsense_is_an_error(tmp_path, monkeypatch):
    from tests import spec_candidates

    monkeypatch.setattr(spec_candidates.gamma_only_supports, "supports", lambda case: "")
    from parity.execute.backends import execute, make_backend

    b = make_backend("asking=jax:tests.spec_candidates:gamma_only_supports")
    res = execute(b, LOGSIG, make_inputs(LOGSIG))
    assert res.status == "error" and "expected True, False or a non-empty string" in res.error


def test_a_not_implemented_error_from_jax_itself_stays_an_error():
    """Only the candidate's own NotImplementedError means 'unsupported': one jax raises (here: a
    primitive without a differentiation rule) is a failure of the candidate, never hidden."""
    from parity.execute.backends import execute, make_backend

    case = Case("simple_gla", 1, 40, 2, 32, 32, gate="gamma_alibi", h0=True)  # fwd + bwd
    b = make_backend("nodiff=jax:tests.spec_candidates:no_gradient")
    res = execute(b, case, make_inputs(case))
    assert res.status == "error" and "NotImplementedError" in res.error


def test_a_kernels_jax_module_that_fails_to_import_is_an_error(monkeypatch):
    """A broken import of the code under test fails its cases; it is never `unsupported` (which the
    gate passes)."""
    from parity.execute.backends import execute, make_backend
    from parity.model import kernels

    monkeypatch.setitem(kernels.PALLAS_KERNELS, "pallas", {"simple_gla": ("kernels_jax.no_such_module", "f")})
    res = execute(make_backend("pallas"), SMALL, make_inputs(SMALL))
    assert res.status == "error" and "no_such_module" in res.error


def test_a_worker_near_the_memory_map_limit_exits_after_its_case_and_is_replaced(tmp_path, monkeypatch):
    """A worker past RETIRE_AT_MAPS of vm.max_map_count (every XLA compile leaves mappings; at the
    limit LLVM aborts the process: seen in parity fuzz after 136 cases) says so with its case's
    result and exits; parity run starts a fresh worker for the next case, no record is lost."""
    from multiprocessing.connection import wait

    from parity.execute.pool import Worker
    from parity.execute.worker import CaseEnded, Done, memory_maps_used

    assert 0 < memory_maps_used() < 0.5  # this process, read from /proc

    def one_case(w):
        w.give(SMALL, ["oracle"])
        events = []
        while not events or not isinstance(events[-1], CaseEnded):
            event = w.poll(bool(wait([w.conn], timeout=1.0)), 120)
            assert event is None or isinstance(event, (Done, CaseEnded)), event
            events += [event] if event else []
        assert [type(e) for e in events] == [Done, CaseEnded] and events[0].line["backend"] == "oracle"
        assert events[1].retire == w.retired
        return w

    stays = one_case(Worker(tmp_path / "a", "t", ()))
    assert not stays.retired and stays.proc.is_alive()
    stays.kill()
    monkeypatch.setenv("PARITY_WORKER_RETIRE_AT_MAPS", "0")  # read by the worker: retire after every case
    leaves = one_case(Worker(tmp_path / "b", "t", ()))
    assert leaves.retired and not leaves.proc.is_alive() and leaves.proc.exitcode == 0
    cases = [SMALL, SMALL.replace(seed=1), SMALL.replace(seed=2)]
    summary = run(cases, ["oracle", CANDIDATES["scan"]], tmp_path / "run", jobs=1, timeout_s=120)
    assert [(r["case_id"], r["verdict"]) for r in summary["results"] if r["backend"] == "scan"] == [
        (c.id, "pass") for c in sorted(cases, key=lambda c: c.id)
    ]
