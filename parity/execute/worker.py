"""The worker processes of `parity run` and `parity fuzz`: the loop a worker runs (`_worker_main`),
the messages it sends, its retirement near the memory-map limit (RETIRE_AT_MAPS), and the parent's
handle on one worker (`_Worker`: give it a case, read what it reports, kill it when it runs past
its timeout or dies, and write the records of the backends it failed on).
"""

from __future__ import annotations

import functools
import os
import time
import traceback
from pathlib import Path

from cases import Case
from parity.execute import compile_log
from parity.execute.case import LazyBackends, _summary_line, run_case
from parity.execute.proc import die_with_parent
from parity.records import base_record, result_path, write_record


# ------------------------------------------------------------------ worker side
def _worker_main(
    conn, out_dir: str, run_id: str, tpu_targets: tuple[str, ...] = (), seeds: tuple[int, int] = (1, 1)
) -> None:
    """Runs cases sent over `conn` (a case dict and its BackendSpecs); reports ('inputs', case_id,
    input_hash), ('start', case_id, spec), ('done', line), ('case', case_id, timing, retire)
    (timing: run_case's, with the case's XLA compilations, parity.execute.compile_log; retire: it
    exits now, RETIRE_AT_MAPS), or ('crash', case_id, error) when the harness itself
    failed on the case. Backends are built lazily, inside a case's timed window."""
    die_with_parent()
    backends = LazyBackends()
    while True:
        msg = conn.recv()
        if msg is None:
            return
        case_dict, todo = msg
        case = Case.from_dict(case_dict)
        try:
            _, timing, _ = run_case(
                case,
                todo,
                backends,
                Path(out_dir),
                run_id,
                on_start=lambda spec: conn.send(("start", case.id, spec)),  # noqa: B023 - called in this iteration
                on_done=lambda line: conn.send(("done", line)),
                on_inputs=lambda h: conn.send(("inputs", case.id, h)),  # noqa: B023 - called in this iteration
                tpu_targets=tpu_targets,
                seeds=seeds,
            )
        except Exception as e:  # noqa: BLE001 - the parent records it for the backends left
            conn.send(
                (
                    "crash",
                    case.id,
                    f"harness error in the worker: {type(e).__name__}: {str(e)[:500]}\n"
                    + traceback.format_exc(limit=-4),
                )
            )
            return
        retire = memory_maps_used() > RETIRE_AT_MAPS
        conn.send(("case", case.id, {**timing, **compile_log.take()}, retire))
        if retire:
            return


# Every XLA compile of a case leaves executable memory mappings in the process (interpret-mode
# kernels: hundreds to a thousand per case), and Linux allows vm.max_map_count (65530) of them: a
# worker that has run some hundred cases dies in LLVM's "Cannot allocate memory" (SIGABRT; seen in
# parity fuzz: 60557 maps after 136 cases). A worker past this share of the limit finishes its case
# and exits; the parent starts a fresh one.
RETIRE_AT_MAPS = float(os.environ.get("PARITY_WORKER_RETIRE_AT_MAPS", "0.5"))  # tests: 0, after every case


def memory_maps_used() -> float:
    """This process's memory mappings as a share of vm.max_map_count (0 where /proc does not say)."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f) / max(1, limit)
    except (OSError, ValueError):
        return 0.0


# ------------------------------------------------------------------ parent side
class _Worker:
    """A worker process running cases (_worker_main) and the parent's view of the case it is on:
    the backends left (todo), the one running (current) and since when (started)."""

    def __init__(self, ctx, out_dir: Path, run_id: str, tpu_targets: tuple[str, ...], seeds=(1, 1)):
        self.out_dir, self.run_id = Path(out_dir), run_id
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker_main, daemon=True, args=(child, str(out_dir), run_id, tuple(tpu_targets), tuple(seeds))
        )
        self.proc.start()
        child.close()
        self.case: Case | None = None
        self.todo: list = []  # BackendSpecs left in the case
        self.current = None  # the BackendSpec running now
        self.started = 0.0
        self.input_hash: str | None = None
        self.retired = False  # it said after its last case that it exits (RETIRE_AT_MAPS)
        self.unit = None  # (case, backends) of the run's schedule this work belongs to (parity.execute.runner)

    def give(self, case: Case, todo: list[str]):
        """The timer starts now: building inputs and backends counts towards the first backend's timeout."""
        self.case, self.todo, self.current, self.input_hash = case, list(todo), None, None
        self.started = time.perf_counter()
        self.conn.send((case.to_dict(), todo))

    def kill(self):
        self.proc.kill()
        self.proc.join(5)

    def poll(self, ready: bool, timeout_s: float) -> tuple[str, object] | None:
        """Read one message when `ready` and say what happened: ("done", summary line) a backend
        finished; ("case", timing) the case did; ("failed", (status, error)) the worker crashed,
        died or ran past timeout_s on its current backend (it is killed); None: nothing yet."""
        msg = None
        if ready:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                msg = ("died",)
            if msg[0] == "inputs":
                self.input_hash = msg[2]
                return None
            if msg[0] == "start":
                self.current, self.started = msg[2], time.perf_counter()
                return None
            if msg[0] == "done":
                self.todo.remove(self.current)
                self.current, self.started = None, time.perf_counter()
                return "done", msg[1]
            if msg[0] == "case":
                self.retired = bool(msg[3])
                if self.retired:
                    self.proc.join(10)
                return "case", msg[2]
        timed_out = time.perf_counter() - self.started > timeout_s
        died = not self.proc.is_alive() or (msg is not None and msg[0] in ("died", "crash"))
        if not (timed_out or died):
            return None
        self.kill()
        if msg is not None and msg[0] == "crash":
            return "failed", ("error", msg[2])
        if timed_out:
            return "failed", ("timeout", f"no result after {timeout_s:g} s; worker killed")
        return "failed", ("error", f"worker process died (exit code {self.proc.exitcode})")

    def fail(self, status: str, error: str, timeout_s: float) -> tuple[list[dict], list]:
        """(records for the backend the worker failed on, and for every backend left when that was
        the oracle: nothing to compare against; the backends left to run)."""
        spec = self.current or (self.todo[0] if self.todo else None)
        if spec is None:
            return [], []
        line = functools.partial(
            _failure_line,
            self.case,
            out_dir=self.out_dir,
            run_id=self.run_id,
            timeout_s=timeout_s,
            input_hash=self.input_hash,
        )
        lines = [line(spec, status, error)]
        rest = [s for s in self.todo if s != spec]
        if spec.side == "oracle":
            lines += [line(s, "error", "the oracle failed for this case, nothing to compare against") for s in rest]
            rest = []
        return lines, rest


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
        return {**_summary_line({**rec, "error": f"the record could not be written ({e}); {error}"}), "written": False}
    return _summary_line(rec)
