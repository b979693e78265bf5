"""Worker processes that send a scripted sequence of events (parity.execute.worker's) instead of
running cases: what the parent's WorkerPool makes of each. Each takes worker_main's arguments."""

import os
import time

from cases import Case
from parity.execute.worker import BackendStarted, CaseEnded, Done, HarnessError, InputsMade

TIMING = {"total_s": 1.0, "backends_s": 0.5, "compile_s": 0.0, "seeds_s": 0.0}


def _line(case_id: str, spec) -> dict:
    return {"case_id": case_id, "backend": spec.name, "status": "ok", "verdict": "pass", "input_hash": "h"}


def _next_case(conn):
    msg = conn.recv()
    if msg is None:
        raise SystemExit(0)
    case_dict, todo = msg
    case = Case.from_dict(case_dict)
    conn.send(InputsMade(case.id, "h"))
    return case, todo


def runs_every_case(conn, *args):
    """Every backend done, then the case ended; again for every case sent."""
    while True:
        case, todo = _next_case(conn)
        for spec in todo:
            conn.send(BackendStarted(case.id, spec))
            conn.send(Done(_line(case.id, spec)))
        conn.send(CaseEnded(case.id, TIMING, False))


def dies_in_its_second_backend(conn, *args):
    case, todo = _next_case(conn)
    conn.send(BackendStarted(case.id, todo[0]))
    conn.send(Done(_line(case.id, todo[0])))
    conn.send(BackendStarted(case.id, todo[1]))
    os._exit(3)


def hangs_in_its_first_backend(conn, *args):
    case, todo = _next_case(conn)
    conn.send(BackendStarted(case.id, todo[0]))
    time.sleep(600)


def fails_in_the_harness(conn, *args):
    case, todo = _next_case(conn)
    conn.send(BackendStarted(case.id, todo[0]))
    conn.send(Done(_line(case.id, todo[0])))
    conn.send(BackendStarted(case.id, todo[1]))
    conn.send(HarnessError(case.id, "harness error in the worker: OSError: disk full"))


def retires_after_each_case(conn, *args):
    """One case run, then it says it retires (RETIRE_AT_MAPS) and exits."""
    case, todo = _next_case(conn)
    for spec in todo:
        conn.send(BackendStarted(case.id, spec))
        conn.send(Done(_line(case.id, spec)))
    conn.send(CaseEnded(case.id, TIMING, True))
