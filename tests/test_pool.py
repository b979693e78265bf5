"""parity.execute.pool: the events a WorkerPool reports for what its worker processes do (workers
scripted in tests.scripted_workers; the real worker in tests/test_runner.py)."""

import json

from parity.execute.backends import parse_specs
from parity.execute.pool import Failed, WorkerPool
from parity.execute.worker import CaseEnded, Done
from tests import scripted_workers

from .helpers import SMALL

SPECS = parse_specs(["oracle", "fla", "pallas"])


def _events(pool: WorkerPool) -> list:
    """(tag, event) of everything the pool reports until no worker is busy."""
    out = []
    while pool.busy:
        out += list(pool.events(wait_s=1.0))
    return out


def _pool(tmp_path, main, timeout_s=60.0) -> WorkerPool:
    return WorkerPool(1, tmp_path, "run-1", timeout_s, main=main)


def test_a_case_gives_a_done_per_backend_then_case_ended_and_the_worker_stays(tmp_path):
    pool = _pool(tmp_path, scripted_workers.runs_every_case)
    try:
        for seed in (0, 1):  # two cases through the same process
            case = SMALL.replace(seed=seed)
            pool.give(case, SPECS, tag=("unit", seed))
            events = _events(pool)
            assert [type(e) for _, e in events] == [Done, Done, Done, CaseEnded]
            assert {tag for tag, _ in events} == {("unit", seed)}
            assert [e.line["backend"] for _, e in events[:3]] == ["oracle", "fla", "pallas"]
            assert events[-1][1] == CaseEnded(case.id, scripted_workers.TIMING, False)
        assert pool.idle == pool.workers and len(pool.pids) == 1 and pool.workers[0].proc.is_alive()
    finally:
        pool.close()
    assert not pool.workers[0].proc.is_alive()


def test_a_worker_that_dies_gives_failed_with_its_record_and_the_backends_left(tmp_path):
    pool = _pool(tmp_path, scripted_workers.dies_in_its_second_backend)
    try:
        pool.give(SMALL, SPECS, tag="u")
        (_, done), (tag, failed) = _events(pool)
        started = set(pool.pids)
    finally:
        pool.close()
    assert isinstance(done, Done) and tag == "u" and isinstance(failed, Failed)
    assert (failed.case_id, failed.status, failed.left) == (SMALL.id, "error", (SPECS[2],))
    assert failed.error == "worker process died (exit code 3)"
    assert [(r["backend"], r["status"]) for r in failed.records] == [("fla", "error")]
    rec = json.loads((tmp_path / "fla" / f"{SMALL.id}.json").read_text())
    assert rec["status"] == "error" and rec["input_hash"] == "h" and rec["run_id"] == "run-1"
    assert pool.workers[0].proc is None and len(started) == 1  # replaced, to start when next given a case


def test_a_worker_past_its_timeout_is_killed_and_an_oracle_timeout_fails_the_whole_case(tmp_path):
    pool = _pool(tmp_path, scripted_workers.hangs_in_its_first_backend, timeout_s=1.0)
    try:
        pool.give(SMALL, SPECS)
        [(_, failed)] = _events(pool)
    finally:
        pool.close()
    assert (failed.status, failed.error, failed.left) == ("timeout", "no result after 1 s; worker killed", ())
    assert [(r["backend"], r["status"]) for r in failed.records] == [
        ("oracle", "timeout"),
        ("fla", "error"),
        ("pallas", "error"),
    ]
    assert "the oracle failed for this case" in failed.records[1]["error"]


def test_a_harness_error_in_the_worker_gives_failed_with_its_message(tmp_path):
    pool = _pool(tmp_path, scripted_workers.fails_in_the_harness)
    try:
        pool.give(SMALL, SPECS)
        (_, done), (_, failed) = _events(pool)
    finally:
        pool.close()
    assert (failed.status, failed.error) == ("error", "harness error in the worker: OSError: disk full")
    assert [r["backend"] for r in failed.records] == ["fla"] and failed.left == (SPECS[2],)


def test_a_retired_worker_is_replaced_by_a_fresh_process_for_the_next_case(tmp_path):
    pool = _pool(tmp_path, scripted_workers.retires_after_each_case)
    try:
        first = pool.workers[0]
        pool.give(SMALL, SPECS[:1])
        assert [type(e) for _, e in _events(pool)] == [Done, CaseEnded]
        assert first.retired and first.proc.exitcode == 0 and pool.workers[0] is not first
        pool.give(SMALL.replace(seed=1), SPECS[:1])
        assert [type(e) for _, e in _events(pool)] == [Done, CaseEnded] and len(pool.pids) == 2
    finally:
        pool.close()
