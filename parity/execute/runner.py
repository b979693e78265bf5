"""`parity run`: take cases through backends, compare against the oracle, write records.

This module holds the run loop: `RunConfig`, `shard`, `Schedule` (the units of work: a case and
the backends to run on it), `run_cases` (plan the units, drain them through a pool of workers,
write the summary and manifests) and its `Progress` line. By default every case goes through every backend in one
unit; a Schedule may hold work back and add more as units finish (`parity mutants` stops a
mutant at the first case that catches it), and the manifest then lists the (case, backend)
pairs it planned. Units run in worker processes (parity.execute.pool's WorkerPool; `jobs` of
them, each forked from a server that imported their libraries: parity.execute.proc), so that a
candidate that hangs is killed after `timeout` seconds and recorded as a timeout, and a crash of
any kind becomes that case's error record; the run goes on and finished results are kept.
Within a case (parity.execute.case) the oracle runs first (cached on disk), then every
other backend; each backend's outputs are compared against the oracle in the worker and
only the JSON record travels back.

Failing closed: a worker builds each backend (imports a candidate's module) inside the
timed window of the case it was given, so `timeout` covers a candidate's whole life in
the worker; workers die with the parent (parity.execute.proc); a record that cannot be
serialised is written as an error record; the parent's own failure path writes what it
can and never raises. A manifest (parity.records.manifest) lists what the run is meant to write,
before the first worker starts and again at the end. SIGINT or SIGTERM (parity.execute.interrupts) end the
workers and FLA's lanes, remove their .tmp-* files and leave a summary of what finished
(summary["interrupted"]), whenever in the run they come.

`WarmWorkers` keeps the workers and FLA's lanes across runs of one config (`parity watch`): runs on
them leave them running, and `reload` has every worker forget the user's modules and candidates
(parity.execute.worker.Reload) so that the next run imports them afresh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path

from cases import Case
from parity.execute import interrupts, verified_cache
from parity.execute.backends import as_spec, fla_configs, fla_lane, fla_launches, parse_specs
from parity.execute.pool import WorkerPool
from parity.execute.worker import CaseEnded, Done, Reload
from parity.measure import tpu_numerics
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN
from parity.model import environ
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
    fla_lanes: int | None = None  # FLA's lanes (parity.execute.backends.fla_lane.started; None: auto)
    fla_fallback: bool = False  # cases CUDA refuses for a known reason go to FLA in the interpreter
    fla_configs: Path | None = None  # FLA's configs: a pins file or a table (parity.execute.backends.fla_configs)
    fla_autotune: bool = False  # FLA's kernels tuned by Triton's autotuner, and a table written of what it chose
    fresh: bool = False  # ignore every cache (oracle, FLA, TPU compiles): PARITY_FRESH=1 for the workers

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
    returns None while one waits) and plan more as units end (`finished`: `plan` a new unit, or
    `join` backends to a case's queued one); every (case, backend) pair it ever planned is in
    `pairs`, which the run's manifest lists. Only these methods change the queue."""

    def __init__(self, cases: list[Case], specs: list):
        self.cases, self.specs = list(cases), list(specs)
        self._queue: deque[tuple[Case, list]] = deque()
        self.pairs: dict[tuple[str, str], None] = {}  # (case_id, backend name), in planning order
        self.planned = 0  # units planned so far
        for c in self.initial_units():
            self.plan(*c)

    def initial_units(self) -> list[tuple[Case, list]]:
        """The units known before the run starts."""
        return [(c, list(self.specs)) for c in self.cases]

    def plan(self, case: Case, specs: list, first: bool = False) -> None:
        """Queue a unit (at the front when `first`) and remember its pairs."""
        (self._queue.appendleft if first else self._queue.append)((case, list(specs)))
        self.note(case, specs)
        self.planned += 1

    def join(self, case: Case, specs: list) -> bool:
        """Add backends to the queued unit of `case` and move that unit to the front (it runs
        next); False, and nothing changed, when no unit of `case` is queued."""
        unit = next((u for u in self._queue if u[0].id == case.id), None)
        if unit is None:
            return False
        unit[1].extend(specs)
        self.note(case, specs)
        self._queue.remove(unit)
        self._queue.appendleft(unit)
        return True

    def queued(self, case: Case) -> bool:
        """Whether a unit of `case` waits in the queue (planned, not yet taken)."""
        return any(u[0].id == case.id for u in self._queue)

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
        return self._queue.popleft() if self._queue else None

    def pending(self) -> bool:
        """Whether units are left, ready or held back."""
        return bool(self._queue)

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


def _remove_temporaries(out_dir: Path, pids: set[int]) -> None:
    """.tmp-<pid>-* files of the given processes (a killed worker's half-written record or
    cache entry)."""
    for d in (Path(out_dir), *(verified_cache.cache_dir(kind) for kind in verified_cache.KINDS)):
        for p in d.rglob(".tmp-*") if d.is_dir() else ():
            if any(p.name.startswith(f".tmp-{pid}-") for pid in pids):
                p.unlink(missing_ok=True)


def run_cases(
    cases: list[Case], cfg: RunConfig, schedule: type[Schedule] | Callable = Schedule, warm: WarmWorkers | None = None
) -> dict:
    """Run every case through cfg.backends (parsed here, once; SpecError on a bad one), in the
    units `schedule(cases, specs)` plans (default: every case through every backend); returns
    the run summary (also written to summary.json). summary["interrupted"] is 'SIGINT' or
    'SIGTERM' when a signal ended the run early. cfg is not changed. With `warm`, the run uses
    its workers and FLA's lanes and leaves them running (killed when a signal ends the run)."""
    if warm is not None and (cfg.run_id != warm.run_id or Path(cfg.out_dir) != warm.out_dir):
        raise ValueError("a run on warm workers must have their run id and output directory")
    run = _plan(cases, cfg, schedule)
    run.write_manifest()
    # the workers and FLA's lanes inherit these, for this run only
    fresh = {environ.FRESH: "1"} if cfg.fresh else {}
    with (
        tpu_numerics.exported(cfg.numerics),
        fla_launches.configured(cfg.fla_configs, cfg.fla_autotune),
        environ.exported(fresh),
    ):
        drained = _drain(run, warm)
    return _summary(run, drained)


class WarmWorkers:
    """Workers and FLA's lanes kept across runs of the same config (`parity watch`): a context
    manager; run_cases(..., warm=this) runs on them, `reload` makes them import the user's changed
    modules afresh. A worker that fails or hangs is killed and replaced as in any run."""

    def __init__(self, cfg: RunConfig, size: int, cases: list[Case]):
        self.cfg, self.size, self.cases = cfg, size, list(cases)
        self.run_id, self.out_dir = cfg.run_id, Path(cfg.out_dir)
        if not self.run_id:
            raise ValueError("warm workers need the run id of every run on them")
        self.pool: WorkerPool | None = None
        self.lanes = fla_lane.Lanes([])
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> WarmWorkers:
        cfg = self.cfg
        uses_fla = any(as_spec(s).side == "reference" for s in cfg.backends)
        stack = self._stack.__enter__()
        try:
            stack.enter_context(tpu_numerics.exported(cfg.numerics))
            stack.enter_context(fla_launches.configured(cfg.fla_configs, cfg.fla_autotune))
            self.lanes = stack.enter_context(fla_lane.started(uses_fla, cfg.fla_lanes, cfg.fla_fallback, self.cases))
            self.pool = WorkerPool(self.size, self.out_dir, self.run_id, cfg.timeout_s, cfg.tpu_targets, cfg.seeds)
            self.pool.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def reload(self, modules: list[str], files: list[str]) -> None:
        """Every worker forgets these modules and the modules of these files, and its candidates."""
        self.pool.reload(Reload(tuple(modules), tuple(str(f) for f in files)))

    def __exit__(self, *exc) -> None:
        try:
            if self.pool is not None:
                self.pool.close(kill=True)
                _remove_temporaries(self.out_dir, {os.getpid(), *self.pool.pids})
        finally:
            self._stack.__exit__(*exc)


@dataclasses.dataclass
class _Run:
    """What a run runs: its cases, config, id, backends (BackendSpecs, the oracle first) and schedule."""

    cases: list[Case]
    cfg: RunConfig
    run_id: str
    specs: list
    schedule: Schedule

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.out_dir)

    def write_manifest(self, lines: list[dict] = (), finished=False, interrupted=False) -> None:
        """The run's manifest: what it is meant to write, and of that what `lines` (summary lines) say
        is written, with the input hashes they report (none before the run)."""
        write_manifest(
            self.out_dir,
            self.run_id,
            "parity run",
            [c.id for c in self.cases],
            [s.name for s in self.specs],
            {ln["case_id"]: ln["input_hash"] for ln in lines if ln.get("input_hash")},
            {(ln["case_id"], ln["backend"]) for ln in lines if ln.get("written", True)},
            finished=finished,
            interrupted=interrupted,
            tpu_targets=self.cfg.tpu_targets,
            pairs=None if self.schedule.full_product else list(self.schedule.pairs),
        )


def _plan(cases: list[Case], cfg: RunConfig, schedule) -> _Run:
    """Parse the backends (the oracle first), check the numerics model, plan the units."""
    given = [as_spec(s) for s in cfg.backends]
    specs = parse_specs(["oracle"]) + parse_specs([s for s in given if s.side != "oracle"])
    if cfg.numerics:
        tpu_numerics.check_model(cfg.numerics)
    return _Run(list(cases), cfg, cfg.run_id or uuid.uuid4().hex[:12], specs, schedule(cases, specs[1:]))


@dataclasses.dataclass
class _Drained:
    """What the workers reported: summary lines, timings per case id, the signal that ended the run
    early (or None) and the loop's wall time."""

    lines: list[dict] = dataclasses.field(default_factory=list)
    timings: dict[str, dict] = dataclasses.field(default_factory=dict)
    interrupted: str | None = None
    wall: float = 0.0
    fla_lanes: fla_lane.Lanes = dataclasses.field(default_factory=lambda: fla_lane.Lanes([]))  # FLA's lanes


class _Units:
    """The run loop's work: units handed to the pool's workers, the rest of a unit whose worker
    failed (retried first, in order), and what their events say (into `drained`)."""

    def __init__(self, run: _Run):
        self.run, self.drained = run, _Drained()
        self.retry: list[tuple[Case, list, tuple[Case, list]]] = []  # (case, backends left, their unit)
        self.progress = Progress(run.schedule.planned, run.cfg.progress)

    def pending(self, pool: WorkerPool) -> bool:
        return bool(self.retry or pool.busy or self.run.schedule.pending())

    def hand_out(self, pool: WorkerPool) -> None:
        """Give every idle worker a unit: a retry first, else the schedule's next (the oracle put first)."""
        while pool.idle:
            if self.retry:
                case, todo, unit = self.retry.pop(0)
            else:
                taken = self.run.schedule.take()
                if taken is None:
                    break
                unit = (taken[0], self.run.specs[:1] + list(taken[1]))
                case, todo = unit
            pool.give(case, todo, tag=unit)
        if not pool.busy:  # the schedule holds work back that nothing running can release
            raise RuntimeError("the schedule holds units back while no worker is busy")

    def take(self, unit: tuple[Case, list], event) -> None:
        """One event of a worker running `unit`."""
        if isinstance(event, Done):
            self.drained.lines.append(event.line)
        elif isinstance(event, CaseEnded):
            prev = self.drained.timings.get(event.case_id)
            timing = event.timing
            self.drained.timings[event.case_id] = timing if prev is None else {k: prev[k] + timing[k] for k in timing}
            self.unit_ended(unit)
        else:  # Failed: its records are written; the case's other backends go on in a fresh worker
            self.drained.lines.extend(event.records)
            if event.left:
                self.retry.append((unit[0], list(event.left), unit))
            else:
                self.unit_ended(unit)

    def unit_ended(self, unit: tuple[Case, list]) -> None:
        self.progress.step(unit[0].id)
        self.run.schedule.finished(unit[0], unit[1][1:])
        self.progress.total = self.run.schedule.planned


def _drain(run: _Run, warm: WarmWorkers | None = None) -> _Drained:
    """Run the schedule's units over cfg.jobs workers (or `warm`'s) until none is left or a signal
    ends the run; the workers are ended (warm ones only by a signal or a failure of the loop) and
    their .tmp-* files removed whatever happens."""
    cfg = run.cfg
    t0 = time.perf_counter()
    units = _Units(run)
    size = max(1, min(cfg.jobs, run.schedule.planned))
    uses_fla = any(s.side == "reference" for s in run.specs)
    if warm is None:
        pool = WorkerPool(size, run.out_dir, run.run_id, cfg.timeout_s, cfg.tpu_targets, cfg.seeds)
        lanes_running = fla_lane.started(uses_fla, cfg.fla_lanes, cfg.fla_fallback, run.cases)
    else:
        pool, lanes_running = warm.pool, contextlib.nullcontext(warm.lanes)
    ended = False
    with interrupts.terminated_as_interrupt():
        try:
            with lanes_running as lanes:
                units.drained.fla_lanes = lanes
                pool.start()
                while units.pending(pool):
                    units.hand_out(pool)
                    for unit, event in pool.events(wait_s=1.0):
                        units.take(unit, event)
                ended = True
        except KeyboardInterrupt as e:  # SIGINT, or SIGTERM (interrupts.Terminated)
            units.drained.interrupted = interrupts.signal_name(e)
        finally:
            try:
                with interrupts.deferred():  # a signal now ends the run once the workers are ended
                    units.progress.close()
                    if warm is None or not ended:
                        pool.close(kill=units.drained.interrupted is not None or warm is not None)
                    _remove_temporaries(run.out_dir, {os.getpid(), *pool.pids})
            except KeyboardInterrupt as e:
                units.drained.interrupted = units.drained.interrupted or interrupts.signal_name(e)
    units.drained.wall = time.perf_counter() - t0
    return units.drained


def _summary(run: _Run, drained: _Drained) -> dict:
    """The run summary, written to summary.json, and the run's final manifest."""
    cfg, lines = run.cfg, drained.lines
    summary = {
        "schema": SCHEMA_VERSION,
        "kind": "run",
        "run_id": run.run_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
        "backends": [s.text for s in run.specs],
        "jobs": cfg.jobs,
        "cases": len(run.cases),
        "units": run.schedule.planned,
        "wall_time_s": drained.wall,
        "tpu_targets": list(cfg.tpu_targets),
        "seeds": list(cfg.seeds),
        "fla_lanes": drained.fla_lanes.devices,
        "fla_precompile": drained.fla_lanes.precompile.summary() if drained.fla_lanes.precompile else None,
        "fla_autotune": cfg.fla_autotune,
        "fla_fallback": cfg.fla_fallback,
        "fla_configs": str(cfg.fla_configs) if cfg.fla_configs else None,
        "fresh": cfg.fresh,
        "fla_tuned_table": fla_configs.write_tuned_table(run.out_dir, f"run {run.run_id}")
        if cfg.fla_autotune
        else None,
        "interrupted": drained.interrupted,
        "timing": _timing_summary(lines, drained.timings, drained.wall),
        "results": sorted(lines, key=lambda r: (r["case_id"], r["backend"])),
    }
    write_json(run.out_dir / "summary.json", encode_nonfinite(summary)[0])
    run.write_manifest(lines, finished=drained.interrupted is None, interrupted=drained.interrupted is not None)
    return summary


def _timing_summary(lines: list[dict], timings: dict, wall: float) -> dict:
    per_backend: dict[str, float] = {}
    reused: dict[str, int] = {}  # backend -> records reused from the harness's cache (FLA's), not run
    for ln in lines:
        per_backend[ln["backend"]] = per_backend.get(ln["backend"], 0.0) + (ln["wall_time_s"] or 0.0)
        if ln.get("reused"):
            reused[ln["backend"]] = reused.get(ln["backend"], 0) + 1
    case_total = sum(t["total_s"] for t in timings.values())
    in_backends = sum(t["backends_s"] for t in timings.values())
    compiling = sum(t.get("compile_s", 0.0) for t in timings.values())  # the TPU compile check
    overhead = case_total - in_backends - compiling
    return {
        "per_backend_s": per_backend,
        "reused": reused,
        "case_total_s": case_total,
        "in_backends_s": in_backends,
        "tpu_compile_s": compiling,
        "harness_overhead_s": overhead,
        "harness_overhead_share": overhead / case_total if case_total else None,
        "wall_s": wall,
    }
