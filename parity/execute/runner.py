"""`parity run`: take cases through backends, compare against the oracle, write records.

This module holds the run loop: `RunConfig`, `shard`, `Schedule` (the units of work: a case and
the backends to run on it), `run_cases` (workers handed units, timeouts, signals, summary and
manifests) and its `Progress` line. By default every case goes through every backend in one
unit; a Schedule may hold work back and add more as units finish (`parity mutants` stops a
mutant at the first case that catches it), and the manifest then lists the (case, backend)
pairs it planned. Units run in worker processes (parity.execute.worker; spawned, `jobs` of
them), so that a candidate that hangs is killed after `timeout` seconds and recorded as a
timeout, and a crash of any kind becomes that case's error record; the run goes on and
finished results are kept.
Within a case (parity.execute.case) the oracle runs first (cached on disk), then every
other backend; each backend's outputs are compared against the oracle in the worker and
only the JSON record travels back.

Failing closed: a worker builds each backend (imports a candidate's module) inside the
timed window of the case it was given, so `timeout` covers a candidate's whole life in
the worker; workers die with the parent (parity.execute.proc); a record that cannot be
serialised is written as an error record; the parent's own failure path writes what it
can and never raises. A manifest (parity.records.manifest) lists what the run is meant to write,
before the first worker starts and again at the end. SIGINT or SIGTERM end the workers,
remove their .tmp-* files and leave a summary of what finished (summary["interrupted"]).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path

from cases import Case
from parity.execute.backends import as_spec, parse_specs
from parity.execute.backends.oracle import cache_dir
from parity.execute.worker import _Worker
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN
from parity.measure.tpu_numerics import ENV, check_model
from parity.records import SCHEMA_VERSION, encode_nonfinite, write_json
from parity.records.manifest import write_manifest

DEFAULT_TIMEOUT_S = 900.0


@dataclasses.dataclass
class RunConfig:
    """What `run_cases` runs; it is read, never changed (run_cases makes its own copies)."""

    out_dir: Path
    backends: list  # BackendSpec or spec text (parsed by run_cases); 'oracle' is always run first
    jobs: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    run_id: str = ""
    progress: bool = True
    tpu_targets: tuple[str, ...] = ()  # compile every jax candidate for these (parity.execute.tpu_compile)
    numerics: str = ""  # TPU numerics model of the jax candidates ("" = default)
    seeds: tuple[int, int] = (SEEDS_MIN, SEEDS_MAX)  # input seeds per case, (min, max): parity.execute.case.run_case

    def __post_init__(self):
        if not (isinstance(self.jobs, int) and self.jobs >= 1):
            raise ValueError(f"jobs={self.jobs!r}: expected an int >= 1")
        lo, hi = self.seeds
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"seeds={self.seeds!r}: expected (min, max) ints with 1 <= min <= max")
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s={self.timeout_s!r}: expected a finite number of seconds > 0")


def shard(cases: list[Case], index: int, count: int) -> list[Case]:
    """Shard `index` of `count` (1-based): every count-th case in id order from index-1.
    Deterministic, disjoint and covering for a fixed case list."""
    if not (count >= 1 and 1 <= index <= count):
        raise ValueError(f"--shard {index}/{count}: expected I/N with 1 <= I <= N")
    ordered = sorted(cases, key=lambda c: c.id)
    return ordered[index - 1 :: count]


class Schedule:
    """The units of a run, handed out one at a time: (case, backends to run on it; BackendSpecs,
    the oracle excluded: run_cases runs it first in every unit). This one runs every case through
    every backend, one unit per case, in the cases' order. A subclass may hold units back (`take`
    returns None while one waits) and plan more as units end (`finished`); every (case, backend)
    pair it ever planned is in `pairs`, which the run's manifest lists."""

    def __init__(self, cases: list[Case], specs: list):
        self.cases, self.specs = list(cases), list(specs)
        self.queue: deque[tuple[Case, list]] = deque()
        self.pairs: dict[tuple[str, str], None] = {}  # (case_id, backend name), in planning order
        self.planned = 0  # units planned so far
        for c in self.initial_units():
            self.plan(*c)

    def initial_units(self) -> list[tuple[Case, list]]:
        """The units known before the run starts."""
        return [(c, list(self.specs)) for c in self.cases]

    def plan(self, case: Case, specs: list, first: bool = False) -> None:
        """Queue a unit (at the front when `first`) and remember its pairs."""
        (self.queue.appendleft if first else self.queue.append)((case, list(specs)))
        self.note(case, specs)
        self.planned += 1

    def note(self, case: Case, specs: list) -> None:
        """Remember (case, backend) pairs as planned (the oracle's with them)."""
        for name in ["oracle", *(s.name for s in specs)]:
            self.pairs[(case.id, name)] = None

    @property
    def full_product(self) -> bool:
        """Whether the plan is exactly every case through every backend (the manifest needs no pairs)."""
        names = ["oracle", *(s.name for s in self.specs)]
        return set(self.pairs) == {(c.id, n) for c in self.cases for n in names}

    def take(self) -> tuple[Case, list] | None:
        """The next unit to run, or None when none is ready now."""
        return self.queue.popleft() if self.queue else None

    def pending(self) -> bool:
        """Whether units are left, ready or held back."""
        return bool(self.queue)

    def finished(self, case: Case, specs: list) -> None:
        """A unit ended: every backend in `specs` has its record (a result, or why it has none)."""


# ------------------------------------------------------------------ the parent
class Progress:
    """One status line on stderr with done/total, elapsed and ETA."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.t0, self.enabled = total, 0, time.time(), enabled
        self.tty = sys.stderr.isatty()

    def step(self, label: str):
        self.done += 1
        if not self.enabled:
            return
        el = time.time() - self.t0
        eta = el / self.done * (self.total - self.done)
        fmt = lambda s: (
            time.strftime("%M:%S", time.gmtime(s)) if s < 3600 else time.strftime("%H:%M:%S", time.gmtime(s))
        )
        bar = "#" * int(20 * self.done / max(1, self.total))
        line = f"[{bar:<20}] {self.done}/{self.total} elapsed {fmt(el)} ETA {fmt(eta)}  {label}"
        print(
            ("\r" + line[:150].ljust(150)) if self.tty else line,
            end="" if self.tty else "\n",
            file=sys.stderr,
            flush=True,
        )

    def close(self):
        if self.enabled and self.tty:
            print(file=sys.stderr)


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the parent during a run."""


def _on_sigterm(signum, frame):
    raise Interrupted("SIGTERM")


def _remove_temporaries(out_dir: Path, pids: set[int]) -> None:
    """.tmp-<pid>-* files of the given processes (a killed worker's half-written record or
    oracle cache entry)."""
    for d in (Path(out_dir), cache_dir()):
        for p in d.rglob(".tmp-*") if d.is_dir() else ():
            if any(p.name.startswith(f".tmp-{pid}-") for pid in pids):
                p.unlink(missing_ok=True)


def run_cases(cases: list[Case], cfg: RunConfig, schedule: type[Schedule] | Callable = Schedule) -> dict:
    """Run every case through cfg.backends (parsed here, once; SpecError on a bad one), in the
    units `schedule(cases, specs)` plans (default: every case through every backend); returns
    the run summary (also written to summary.json). summary["interrupted"] is 'SIGINT' or
    'SIGTERM' when a signal ended the run early. cfg is not changed."""
    out_dir = Path(cfg.out_dir)
    run_id = cfg.run_id or uuid.uuid4().hex[:12]
    given = [as_spec(s) for s in cfg.backends]
    specs = parse_specs(["oracle"]) + parse_specs([s for s in given if s.side != "oracle"])
    if cfg.numerics:  # workers inherit it (parity.measure.tpu_numerics reads it on first use)
        os.environ[ENV] = check_model(cfg.numerics)
    names = [s.name for s in specs]
    plan = schedule(cases, specs[1:])

    def manifest(hashes=None, completed=(), finished=False, interrupted=False):
        write_manifest(
            out_dir,
            run_id,
            "parity run",
            [c.id for c in cases],
            names,
            hashes,
            completed,
            finished=finished,
            interrupted=interrupted,
            tpu_targets=cfg.tpu_targets,
            pairs=None if plan.full_product else list(plan.pairs),
        )

    manifest()
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    lines: list[dict] = []
    timings: dict[str, dict] = {}
    workers: list[_Worker] = []
    pids = {os.getpid()}
    interrupted = None
    retry: list[tuple[Case, list, tuple[Case, list]]] = []  # (case, backends left, the unit they belong to)
    progress = Progress(plan.planned, cfg.progress)
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None

    def spawn() -> _Worker:
        w = _Worker(ctx, out_dir, run_id, tuple(cfg.tpu_targets), cfg.seeds)
        pids.add(w.proc.pid)
        return w

    def unit_ended(unit: tuple[Case, list]) -> None:
        progress.step(unit[0].id)
        plan.finished(unit[0], unit[1][1:])
        progress.total = plan.planned

    def fail(w: _Worker, status: str, err: str) -> None:
        """Record `status` for the backend the worker was on, and go on with the case's others."""
        failed, rest = w.fail(status, err, cfg.timeout_s)
        lines.extend(failed)  # none when it died after its last backend's record
        if rest:
            retry.append((w.case, rest, w.unit))
        else:
            unit_ended(w.unit)

    try:
        workers = [spawn() for _ in range(max(1, min(cfg.jobs, plan.planned)))]
        idle = list(workers)
        busy: list[_Worker] = []
        while retry or busy or plan.pending():
            while idle:
                if retry:
                    case, todo, unit = retry.pop(0)
                else:
                    unit = plan.take()
                    if unit is None:
                        break
                    unit = (unit[0], specs[:1] + list(unit[1]))
                    case, todo = unit
                w = idle.pop()
                w.give(case, todo)
                w.unit = unit
                busy.append(w)
            if not busy:  # the schedule holds work back that nothing running can release
                raise RuntimeError("the schedule holds units back while no worker is busy")
            ready = wait([w.conn for w in busy], timeout=1.0)
            for w in list(busy):
                event = w.poll(w.conn in ready, cfg.timeout_s)
                if event is None:
                    continue
                kind, value = event
                if kind == "done":
                    lines.append(value)
                    continue
                if kind == "case":
                    prev = timings.get(w.case.id)
                    timings[w.case.id] = value if prev is None else {k: prev[k] + value[k] for k in value}
                    busy.remove(w)
                    unit_ended(w.unit)
                    if w.retired:  # it exited after this case (RETIRE_AT_MAPS): a fresh one in its place
                        fresh = spawn()
                        workers[workers.index(w)] = fresh
                        w = fresh
                    idle.append(w)
                    continue
                fail(w, *value)
                busy.remove(w)
                nw = spawn()
                workers[workers.index(w)] = nw
                idle.append(nw)
    except KeyboardInterrupt:
        interrupted = "SIGINT"
    except Interrupted as e:
        interrupted = str(e)
    finally:
        progress.close()
        for w in workers:
            if interrupted:
                w.kill()
                continue
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in workers:
            w.proc.join(10)
            if w.proc.is_alive():
                w.kill()
        _remove_temporaries(out_dir, pids)
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)
    wall = time.perf_counter() - t0
    summary = {
        "schema": SCHEMA_VERSION,
        "kind": "run",
        "run_id": run_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
        "backends": [s.text for s in specs],
        "jobs": cfg.jobs,
        "cases": len(cases),
        "units": plan.planned,
        "wall_time_s": wall,
        "tpu_targets": list(cfg.tpu_targets),
        "seeds": list(cfg.seeds),
        "interrupted": interrupted,
        "timing": _timing_summary(lines, timings, wall),
        "results": sorted(lines, key=lambda r: (r["case_id"], r["backend"])),
    }
    write_json(out_dir / "summary.json", encode_nonfinite(summary)[0])
    manifest(
        {ln["case_id"]: ln["input_hash"] for ln in lines if ln.get("input_hash")},
        {(ln["case_id"], ln["backend"]) for ln in lines if ln.get("written", True)},
        finished=interrupted is None,
        interrupted=interrupted is not None,
    )
    return summary


def _timing_summary(lines: list[dict], timings: dict, wall: float) -> dict:
    per_backend: dict[str, float] = {}
    for ln in lines:
        per_backend[ln["backend"]] = per_backend.get(ln["backend"], 0.0) + (ln["wall_time_s"] or 0.0)
    case_total = sum(t["total_s"] for t in timings.values())
    in_backends = sum(t["backends_s"] for t in timings.values())
    compiling = sum(t.get("compile_s", 0.0) for t in timings.values())  # the TPU compile check
    overhead = case_total - in_backends - compiling
    return {
        "per_backend_s": per_backend,
        "case_total_s": case_total,
        "in_backends_s": in_backends,
        "tpu_compile_s": compiling,
        "harness_overhead_s": overhead,
        "harness_overhead_share": overhead / case_total if case_total else None,
        "wall_s": wall,
    }
