"""The parent's side of the worker processes of `parity run` and `parity fuzz`: `Worker`, its handle
on one process (give it a case, read the events it sends, kill it when it runs past its timeout or
dies, and write the records of the backends it failed on), and `WorkerPool`, workers handed cases
and their events read together.

Events a consumer reads (`WorkerPool.events`, `Worker.poll`): Done (a backend's record is written),
CaseEnded (the case is done; parity.execute.worker) and Failed (the worker crashed, died or ran past
its timeout; the parent wrote the records of the backends it failed on and the process is gone).
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing as mp
import time
from collections.abc import Iterator
from multiprocessing.connection import wait
from pathlib import Path

from cases import Case
from parity.execute import proc
from parity.execute.case import summary_line
from parity.execute.worker import BackendStarted, CaseEnded, Done, HarnessError, InputsMade, Reload, worker_main
from parity.model.spec import as_spec
from parity.records import base_record, result_path, write_record


@dataclasses.dataclass(frozen=True)
class Failed:
    """The worker failed on its case and is gone. status: the record status ("error" when it crashed,
    died or the harness failed in it; "timeout" when it ran past its timeout on a backend); error:
    why; records: the summary lines of the records the parent wrote for the backends it failed on
    (none when it died after its last backend's record); left: the backends still to run, in a
    fresh worker."""

    case_id: str
    status: str
    error: str
    records: tuple[dict, ...]
    left: tuple


Event = Done | CaseEnded | Failed


class Worker:
    """One worker process (parity.execute.worker.worker_main, started on first use) and the parent's
    view of the case it is on: the backends left (todo), the one running (current) and since when
    (started). `main` is the function the process runs (tests give a scripted one)."""

    def __init__(self, out_dir: Path, run_id: str, tpu_targets: tuple[str, ...] = (), seeds=(1, 1), main=None):
        self.out_dir, self.run_id = Path(out_dir), run_id
        self.args = (str(out_dir), run_id, tuple(tpu_targets), tuple(seeds))
        self.main = main or worker_main
        self.conn = self.proc = None
        self.case: Case | None = None
        self.todo: list = []  # backends left in the case
        self.current = None  # the backend running now
        self.started = 0.0
        self.input_hash: str | None = None
        self.retired = False  # it said after its last case that it exits (RETIRE_AT_MAPS)
        self.tag = None  # what the pool's consumer gave with the case (WorkerPool.give)

    def start(self) -> None:
        self.conn, child = mp.Pipe()
        self.proc = proc.start(self.main, (child, *self.args))
        child.close()

    def give(self, case: Case, todo: list) -> None:
        """The timer starts now: building inputs and backends counts towards the first backend's timeout."""
        if self.proc is None:
            self.start()
        self.case, self.todo, self.current, self.input_hash = case, list(todo), None, None
        self.started = time.perf_counter()
        self.conn.send((case.to_dict(), list(todo)))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)

    def poll(self, ready: bool, timeout_s: float) -> Event | None:
        """Read one message when `ready` and say what happened (Done, CaseEnded, Failed: then the
        worker is killed), or None: nothing yet."""
        msg, closed = None, False
        if ready:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                closed = True
        if isinstance(msg, (InputsMade, BackendStarted, Done, CaseEnded)):
            return self._note(msg)
        timed_out = time.perf_counter() - self.started > timeout_s
        died = not self.proc.is_alive() or closed or isinstance(msg, HarnessError)
        if not (timed_out or died):
            return None
        self.kill()
        if isinstance(msg, HarnessError):
            return self.fail("error", msg.error, timeout_s)
        if timed_out:
            return self.fail("timeout", f"no result after {timeout_s:g} s; worker killed", timeout_s)
        return self.fail("error", f"worker process died (exit code {self.proc.exitcode})", timeout_s)

    def _note(self, msg) -> Event | None:
        """Follow the case through a message of a worker still running it; the event it makes, if any."""
        if isinstance(msg, InputsMade):
            self.input_hash = msg.input_hash
            return None
        if isinstance(msg, BackendStarted):
            self.current, self.started = msg.spec, time.perf_counter()
            return None
        if isinstance(msg, Done):
            self.todo.remove(self.current)
            self.current, self.started = None, time.perf_counter()
            return msg
        self.retired = msg.retire  # CaseEnded
        if self.retired:
            self.proc.join(10)
        return msg

    def fail(self, status: str, error: str, timeout_s: float) -> Failed:
        """Write the records of the backend the worker failed on, and of every backend left when that
        was the oracle (nothing to compare against); the Failed event that lists them."""
        spec = self.current or (self.todo[0] if self.todo else None)
        if spec is None:
            return Failed(self.case.id, status, error, (), ())
        spec = as_spec(spec)
        line = functools.partial(
            _failure_line,
            self.case,
            out_dir=self.out_dir,
            run_id=self.run_id,
            timeout_s=timeout_s,
            input_hash=self.input_hash,
        )
        lines = [line(spec, status, error)]
        rest = [s for s in self.todo if as_spec(s) != spec]
        if spec.side == "oracle":
            no_oracle = "the oracle failed for this case, nothing to compare against"
            lines += [line(as_spec(s), "error", no_oracle) for s in rest]
            rest = []
        return Failed(self.case.id, status, error, tuple(lines), tuple(rest))


def _failure_line(
    case: Case, spec, status: str, error: str, out_dir: Path, run_id: str, timeout_s: float, input_hash: str | None
) -> dict:
    """Record written by the parent for a backend (a BackendSpec) whose worker timed out or died.
    It never raises: it uses the input hash the worker reported (rebuilding inputs could be what
    failed) and, when the record cannot be written, says so in the summary line."""
    rec = base_record(case, spec, spec.name, spec.side, input_hash, run_id)
    rec.update(
        status=status,
        verdict=status,
        error=error,
        tensors={},
        platform="",
        implementation="",
        versions={},
        kernel_time_s=None,
        wall_time_s=timeout_s if status == "timeout" else None,
        notes={},
    )
    try:
        rec = write_record(result_path(out_dir, spec.name, case.id), rec)
    except OSError as e:
        return {**summary_line({**rec, "error": f"the record could not be written ({e}); {error}"}), "written": False}
    return summary_line(rec)


class WorkerPool:
    """`size` worker processes (parity.execute.proc.start) running cases with a per-backend timeout.
    `give` hands a case to an idle worker, the last one to become idle first (starting its process
    when it has none yet); `events` reads what the busy ones report. A worker that failed or retired
    is replaced by a fresh one, started when it is next given a case. `pids`: every process started."""

    def __init__(
        self, size: int, out_dir: Path, run_id: str, timeout_s: float, tpu_targets=(), seeds=(1, 1), main=None
    ):
        self.timeout_s = timeout_s
        self.new_worker = functools.partial(Worker, Path(out_dir), run_id, tuple(tpu_targets), tuple(seeds), main)
        self.busy: list[Worker] = []
        self.pids: set[int] = set()
        self.workers = [self.new_worker() for _ in range(size)]
        self.idle = list(self.workers)

    def start(self) -> None:
        """Start every worker now (rather than when it is first given a case)."""
        for w in self.workers:
            if w.proc is None:
                w.start()
                self.pids.add(w.proc.pid)

    def give(self, case: Case, todo: list, tag=None) -> None:
        """Hand a case and its backends to an idle worker (there must be one); `tag` comes back with
        every event of the case."""
        w = self.idle.pop()
        w.give(case, todo)
        w.tag = tag
        self.pids.add(w.proc.pid)
        self.busy.append(w)

    def events(self, wait_s: float = 1.0) -> Iterator[tuple[object, Event]]:
        """(tag, event) of every busy worker that has one, within `wait_s` seconds; a worker whose
        case ended or failed is idle again after its event is consumed."""
        ready = wait([w.conn for w in self.busy], timeout=wait_s)
        for w in list(self.busy):
            event = w.poll(w.conn in ready, self.timeout_s)
            if event is None:
                continue
            ended = not isinstance(event, Done)
            if ended:
                self.busy.remove(w)
            yield w.tag, event
            if ended:
                self.idle.append(self._replace(w) if isinstance(event, Failed) or w.retired else w)

    def _replace(self, w: Worker) -> Worker:
        fresh = self.new_worker()
        self.workers[self.workers.index(w)] = fresh
        return fresh

    def reload(self, reload: Reload) -> None:
        """Send `reload` to every started worker (none may be busy); one whose pipe is gone is replaced."""
        if self.busy:
            raise RuntimeError("reload while workers are busy")
        for w in [w for w in self.workers if w.proc is not None]:
            try:
                w.conn.send(reload)
            except (OSError, BrokenPipeError):
                w.kill()
                self.idle[self.idle.index(w)] = self._replace(w)

    def close(self, kill: bool = False) -> None:
        """End every worker: asked to exit (killed after 10 s), or killed at once when `kill`."""
        started = [w for w in self.workers if w.proc is not None]
        for w in started:
            if kill:
                w.kill()
                continue
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in started:
            w.proc.join(10)
            if w.proc.is_alive():
                w.kill()
