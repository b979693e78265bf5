"""`parity run`: take cases through backends, compare against the oracle, write records.

Cases run in worker processes (spawned, `jobs` of them), so that a candidate that hangs
is killed after `timeout` seconds and recorded as a timeout, and a crash of any kind
becomes that case's error record; the run goes on and finished results are kept.
Within a case the oracle runs first (cached on disk), then every other backend; each
backend's outputs are compared against the oracle in the worker and only the JSON
record travels back.

Failing closed: a worker builds each backend (imports a candidate's module) inside the
timed window of the case it was given, so `timeout` covers a candidate's whole life in
the worker; workers die with the parent (parity.proc); a record that cannot be
serialised is written as an error record; the parent's own failure path writes what it
can and never raises. A manifest (parity.manifest) lists what the run is meant to write,
before the first worker starts and again at the end. SIGINT or SIGTERM end the workers,
remove their .tmp-* files and leave a summary of what finished (summary["interrupted"]).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from multiprocessing.connection import wait
from pathlib import Path

from cases import Case

from . import SCHEMA_VERSION
from .records import ResultRecord, base_record, encode_nonfinite, result_path, worst_verdict, write_json, write_record

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
    tpu_targets: tuple[str, ...] = ()  # compile every jax candidate for these (parity.tpu_compile)
    numerics: str = ""  # TPU numerics model of the jax candidates ("" = default)

    def __post_init__(self):
        if not (isinstance(self.jobs, int) and self.jobs >= 1):
            raise ValueError(f"jobs={self.jobs!r}: expected an int >= 1")
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s={self.timeout_s!r}: expected a finite number of seconds > 0")


def shard(cases: list[Case], index: int, count: int) -> list[Case]:
    """Shard `index` of `count` (1-based): every count-th case in id order from index-1.
    Deterministic, disjoint and covering for a fixed case list."""
    if not (count >= 1 and 1 <= index <= count):
        raise ValueError(f"--shard {index}/{count}: expected I/N with 1 <= I <= N")
    ordered = sorted(cases, key=lambda c: c.id)
    return ordered[index - 1 :: count]


# ------------------------------------------------------------------ worker side
def _tensor_records(case, result, oracle, scales) -> dict:
    from .compare import compare_tensor

    recs = {}
    for name in case.output_names():
        if name in result.tensors:
            recs[name] = compare_tensor(case, name, result.tensors[name], oracle[name], scales.get(name))
        else:
            reason = result.notes.get("unsupported_tensors", {}).get(name, "not returned")
            recs[name] = {"verdict": "unsupported", "reason": reason}
    return recs


def _oracle_tensor_stats(tensors) -> dict:
    import numpy as np

    return {
        n: {
            "shape": list(a.shape),
            "rms": float(np.sqrt(np.mean(np.square(a)))) if a.size else 0.0,
            "max_abs": float(np.abs(a).max(initial=0.0)),
            "nonfinite": int(np.sum(~np.isfinite(a))),
            "verdict": "pass",
        }
        for n, a in tensors.items()
    }


def _record(case, spec, result, oracle, input_hash, run_id, scales=None) -> ResultRecord:
    """The result record of `result` (spec: the BackendSpec, or its text, it ran as); `oracle`
    the oracle's tensors, `scales` its error scales (references.error_scales)."""
    rec = base_record(case, spec, result.backend, result.side, input_hash, run_id)
    rec.update(
        status=result.status,
        platform=result.platform,
        implementation=result.implementation,
        versions=result.versions,
        numerics=result.numerics,
        kernel_time_s=result.kernel_time_s,
        wall_time_s=result.wall_time_s,
        error=result.error,
        notes=result.notes,
    )
    if result.status != "ok":
        rec["tensors"], rec["verdict"] = {}, result.status
    elif result.side == "oracle":
        rec["tensors"] = _oracle_tensor_stats(result.tensors)
        rec["verdict"] = "pass"
    else:
        rec["tensors"] = _tensor_records(case, result, oracle, scales or {})
        tv = [t["verdict"] for t in rec["tensors"].values()]
        rec["verdict"] = (
            worst_verdict([v for v in tv if v != "unsupported"])
            if any(v != "unsupported" for v in tv)
            else "unsupported"
        )
    return rec


def _summary_line(rec: dict) -> dict:
    worst_name, worst_eps = None, None
    for name, t in rec.get("tensors", {}).items():
        eps = t.get("rel_rms")
        if t.get("nan") or t.get("inf"):
            worst_name, worst_eps = name, None
            break
        if eps is not None and (
            worst_eps is None
            or eps / max(t["tol"], 1e-300) > worst_eps / max(rec["tensors"][worst_name]["tol"], 1e-300)
        ):
            worst_name, worst_eps = name, eps
    return {
        "case_id": rec["case_id"],
        "backend": rec["backend"],
        "side": rec["side"],
        "status": rec["status"],
        "verdict": rec["verdict"],
        "platform": rec.get("platform", ""),
        "worst_tensor": worst_name,
        "worst_rel_rms": worst_eps,
        "wall_time_s": rec.get("wall_time_s"),
        "kernel_time_s": rec.get("kernel_time_s"),
        "error": (rec.get("error") or "").splitlines()[0][:300] if rec.get("error") else None,
        "input_hash": rec.get("input_hash"),
    }


class LazyBackends(dict):
    """spec (BackendSpec or its text) -> backend, built on first use (so inside the timed window
    of a case), or the exception that creating it raised (recorded per case)."""

    def __missing__(self, spec):
        from .backends import make_backend

        try:
            b = make_backend(spec)
        except Exception as e:  # noqa: BLE001 - recorded per case
            b = e
        self[spec] = b
        return b


def build_backends(specs: list) -> dict:
    """spec -> backend, or the exception that creating it raised (recorded per case)."""
    out = LazyBackends()
    for spec in specs:
        out[spec]  # built now
    return out


def compile_for_targets(case: Case, spec, backend, targets, out_dir: Path, run_id: str) -> dict | None:
    """Compile a jax candidate's program for the TPU targets; write and return its compile
    record (None for a backend that compiles nothing for TPU, or has no kernel for the case).
    spec: a BackendSpec or its text."""
    from .backends import Unsupported, as_spec
    from .tpu_compile import compile_record

    if not targets or getattr(backend, "side", None) != "candidate" or not hasattr(backend, "compile_subject"):
        return None
    try:
        subject = backend.compile_subject(case)
    except Unsupported:
        return None
    spec = as_spec(spec)
    rec = compile_record(case, spec.text, spec.name, subject, targets, run_id)
    write_json(result_path(Path(out_dir), spec.name, case.id, kind="compile"), rec)
    return rec


def run_case(
    case: Case,
    todo: list,
    backends: dict,
    out_dir: Path,
    run_id: str,
    on_start=lambda spec: None,
    on_done=lambda line: None,
    on_inputs=lambda h: None,
    tpu_targets: tuple[str, ...] = (),
) -> tuple[list[dict], dict, list[dict]]:
    """Run one case through the backends in `todo` (BackendSpecs or their texts, oracle first;
    `backends` maps each to its backend), write a record per backend, compile each jax candidate
    for `tpu_targets`, and return (records, timing, compile records). Used by worker processes
    and the pytest plugin."""
    from cases import input_hash, make_inputs
    from references import error_scales

    from .backends import BackendResult, as_spec, execute
    from .backends.oracle import cached_oracle

    t_case = time.perf_counter()
    inputs = make_inputs(case)
    h = input_hash(inputs)
    on_inputs(h)
    oracle, scales = None, {}
    backend_wall = compile_wall = 0.0
    records, compiles = [], []
    has_oracle = any(as_spec(item).side == "oracle" for item in todo)
    for item in todo:
        spec = as_spec(item)
        name = spec.name
        on_start(item)
        b = backends[item]
        if isinstance(b, Exception):
            result = BackendResult(
                backend=name,
                side=spec.side,
                status="error",
                tensors={},
                error=f"backend could not be created: {type(b).__name__}: {b}",
            )
        elif spec.side != "oracle" and oracle is None and has_oracle:
            result = BackendResult(
                backend=name,
                side=b.side,
                status="error",
                tensors={},
                error="the oracle failed for this case, nothing to compare against",
            )
        else:
            if spec.side != "oracle" and oracle is None:
                full = cached_oracle(case, inputs)[0]
                oracle, scales = {n: full[n] for n in case.output_names()}, error_scales(full)
            result = execute(b, case, inputs)
            backend_wall += result.wall_time_s or 0.0
            if spec.side == "oracle" and result.status == "ok":
                oracle, scales = result.tensors, result.notes["error_scales"]
        try:
            rec = _record(case, spec, result, oracle, h, run_id, scales)
        except Exception:  # noqa: BLE001 - a comparison bug must not lose the run
            result = dataclasses.replace(
                result, status="error", tensors={}, error="comparison failed:\n" + traceback.format_exc(limit=-4)
            )
            rec = _record(case, spec, result, oracle, h, run_id, scales)
        rec = write_record(result_path(Path(out_dir), name, case.id), rec)
        records.append(rec)
        if result.status != "unsupported" and not isinstance(b, Exception):
            t_compile = time.perf_counter()
            try:
                crec = compile_for_targets(case, spec, b, tpu_targets, out_dir, run_id)
            except Exception:  # noqa: BLE001 - a compile-check bug must not lose the run
                crec = None
                rec["notes"]["compile_check_error"] = traceback.format_exc(limit=-4)
                rec = write_record(result_path(Path(out_dir), name, case.id), rec)
            if crec is not None:
                compiles.append(crec)
            compile_wall += time.perf_counter() - t_compile
        on_done(_summary_line(rec))
    return (
        records,
        {"total_s": time.perf_counter() - t_case, "backends_s": backend_wall, "compile_s": compile_wall},
        compiles,
    )


def _worker_main(conn, out_dir: str, run_id: str, tpu_targets: tuple[str, ...] = ()) -> None:
    """Runs cases sent over `conn` (a case dict and its BackendSpecs); reports ('inputs', case_id,
    input_hash), ('start', case_id, spec), ('done', line), ('case', case_id, timing, retire)
    (retire: it exits now, RETIRE_AT_MAPS), or ('crash', case_id, error) when the harness itself
    failed on the case. Backends are built lazily, inside a case's timed window."""
    from .proc import die_with_parent

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
        conn.send(("case", case.id, timing, retire))
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

    def __init__(self, ctx, out_dir: Path, run_id: str, tpu_targets: tuple[str, ...]):
        self.out_dir, self.run_id = Path(out_dir), run_id
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker_main, daemon=True, args=(child, str(out_dir), run_id, tuple(tpu_targets))
        )
        self.proc.start()
        child.close()
        self.case: Case | None = None
        self.todo: list = []  # BackendSpecs left in the case
        self.current = None  # the BackendSpec running now
        self.started = 0.0
        self.input_hash: str | None = None
        self.retired = False  # it said after its last case that it exits (RETIRE_AT_MAPS)

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


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the parent during a run."""


def _on_sigterm(signum, frame):
    raise Interrupted("SIGTERM")


def _remove_temporaries(out_dir: Path, pids: set[int]) -> None:
    """.tmp-<pid>-* files of the given processes (a killed worker's half-written record or
    oracle cache entry)."""
    from .backends.oracle import cache_dir

    for d in (Path(out_dir), cache_dir()):
        for p in d.rglob(".tmp-*") if d.is_dir() else ():
            if any(p.name.startswith(f".tmp-{pid}-") for pid in pids):
                p.unlink(missing_ok=True)


def run_cases(cases: list[Case], cfg: RunConfig) -> dict:
    """Run every case through cfg.backends (parsed here, once; SpecError on a bad one); returns the
    run summary (also written to summary.json). summary["interrupted"] is 'SIGINT' or 'SIGTERM'
    when a signal ended the run early. cfg is not changed."""
    from .backends import as_spec, parse_specs
    from .manifest import write_manifest

    out_dir = Path(cfg.out_dir)
    run_id = cfg.run_id or uuid.uuid4().hex[:12]
    given = [as_spec(s) for s in cfg.backends]
    specs = parse_specs(["oracle"]) + parse_specs([s for s in given if s.side != "oracle"])
    if cfg.numerics:  # workers inherit it (parity.tpu_numerics reads it on first use)
        from .tpu_numerics import ENV, check_model

        os.environ[ENV] = check_model(cfg.numerics)
    names = [s.name for s in specs]
    write_manifest(out_dir, run_id, "parity run", [c.id for c in cases], names, tpu_targets=cfg.tpu_targets)
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    pending = list(cases)
    lines: list[dict] = []
    timings: dict[str, dict] = {}
    workers: list[_Worker] = []
    pids = {os.getpid()}
    interrupted = None
    retry: list[tuple[Case, list[str]]] = []
    progress = Progress(len(cases), cfg.progress)
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None

    def spawn() -> _Worker:
        w = _Worker(ctx, out_dir, run_id, tuple(cfg.tpu_targets))
        pids.add(w.proc.pid)
        return w

    def fail(w: _Worker, status: str, err: str) -> None:
        """Record `status` for the backend the worker was on, and go on with the case's others."""
        failed, rest = w.fail(status, err, cfg.timeout_s)
        if not failed:
            return
        lines.extend(failed)
        if rest:
            retry.append((w.case, rest))
        else:
            progress.step(w.case.id)

    try:
        workers = [spawn() for _ in range(max(1, min(cfg.jobs, len(cases))))]
        idle = list(workers)
        busy: list[_Worker] = []
        while pending or retry or busy:
            while idle and (retry or pending):
                w = idle.pop()
                case, todo = retry.pop(0) if retry else (pending.pop(0), specs)
                w.give(case, todo)
                busy.append(w)
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
                    timings[w.case.id] = value
                    busy.remove(w)
                    progress.step(w.case.id)
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
        "wall_time_s": wall,
        "tpu_targets": list(cfg.tpu_targets),
        "interrupted": interrupted,
        "timing": _timing_summary(lines, timings, wall),
        "results": sorted(lines, key=lambda r: (r["case_id"], r["backend"])),
    }
    write_json(out_dir / "summary.json", encode_nonfinite(summary)[0])
    write_manifest(
        out_dir,
        run_id,
        "parity run",
        [c.id for c in cases],
        names,
        {ln["case_id"]: ln["input_hash"] for ln in lines if ln.get("input_hash")},
        {(ln["case_id"], ln["backend"]) for ln in lines if ln.get("written", True)},
        finished=interrupted is None,
        interrupted=interrupted is not None,
        tpu_targets=cfg.tpu_targets,
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
