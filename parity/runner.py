"""`parity run`: take cases through backends, compare against the oracle, write records.

Cases run in worker processes (spawned, `jobs` of them), so that a candidate that hangs
is killed after `timeout` seconds and recorded as a timeout, and a crash of any kind
becomes that case's error record; the run goes on and finished results are kept.
Within a case the oracle runs first (cached on disk), then every other backend; each
backend's outputs are compared against the oracle in the worker and only the JSON
record travels back.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import sys
import time
import traceback
import uuid
from multiprocessing.connection import wait
from pathlib import Path

from cases import Case

from . import SCHEMA_VERSION
from .records import base_record, result_path, worst_verdict, write_json

DEFAULT_TIMEOUT_S = 900.0


@dataclasses.dataclass
class RunConfig:
    out_dir: Path
    backends: list[str]            # specs; 'oracle' is always run first
    jobs: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    run_id: str = ""
    progress: bool = True
    tpu_targets: tuple[str, ...] = ()   # compile every jax candidate for these (parity.tpu_compile)
    numerics: str = ""                  # TPU numerics model of the jax candidates ("" = default)


def shard(cases: list[Case], index: int, count: int) -> list[Case]:
    """Shard `index` of `count` (1-based): every count-th case in id order from index-1.
    Deterministic, disjoint and covering for a fixed case list."""
    if not (count >= 1 and 1 <= index <= count):
        raise ValueError(f"--shard {index}/{count}: expected I/N with 1 <= I <= N")
    ordered = sorted(cases, key=lambda c: c.id)
    return ordered[index - 1::count]


# ------------------------------------------------------------------ worker side
def _tensor_records(case, result, oracle) -> dict:
    from .compare import compare_tensor
    recs = {}
    for name in case.output_names():
        if name in result.tensors:
            recs[name] = compare_tensor(case, name, result.tensors[name], oracle[name])
        else:
            reason = result.notes.get("unsupported_tensors", {}).get(name, "not returned")
            recs[name] = {"verdict": "unsupported", "reason": reason}
    return recs


def _oracle_tensor_stats(tensors) -> dict:
    import numpy as np
    return {n: {"shape": list(a.shape), "rms": float(np.sqrt(np.mean(np.square(a)))) if a.size else 0.0,
                "max_abs": float(np.abs(a).max(initial=0.0)), "nonfinite": int(np.sum(~np.isfinite(a))),
                "verdict": "pass"} for n, a in tensors.items()}


def _record(case, spec, result, oracle, input_hash, run_id) -> dict:
    rec = base_record(case, spec, result.backend, result.side, input_hash, run_id)
    rec.update(status=result.status, platform=result.platform, implementation=result.implementation,
               versions=result.versions, numerics=result.numerics, kernel_time_s=result.kernel_time_s,
               wall_time_s=result.wall_time_s, error=result.error, notes=result.notes)
    if result.status != "ok":
        rec["tensors"], rec["verdict"] = {}, result.status
    elif result.side == "oracle":
        rec["tensors"] = _oracle_tensor_stats(result.tensors)
        rec["verdict"] = "pass"
    else:
        rec["tensors"] = _tensor_records(case, result, oracle)
        tv = [t["verdict"] for t in rec["tensors"].values()]
        rec["verdict"] = worst_verdict([v for v in tv if v != "unsupported"]) if any(v != "unsupported" for v in tv) else "unsupported"
    return rec


def _summary_line(rec: dict) -> dict:
    worst_name, worst_eps = None, None
    for name, t in rec.get("tensors", {}).items():
        eps = t.get("rel_rms")
        if t.get("nan") or t.get("inf"):
            worst_name, worst_eps = name, None
            break
        if eps is not None and (worst_eps is None or eps / max(t["tol"], 1e-300) > worst_eps / max(rec["tensors"][worst_name]["tol"], 1e-300)):
            worst_name, worst_eps = name, eps
    return {"case_id": rec["case_id"], "backend": rec["backend"], "side": rec["side"], "status": rec["status"],
            "verdict": rec["verdict"], "platform": rec.get("platform", ""), "worst_tensor": worst_name,
            "worst_rel_rms": worst_eps, "wall_time_s": rec.get("wall_time_s"), "kernel_time_s": rec.get("kernel_time_s"),
            "error": (rec.get("error") or "").splitlines()[0][:300] if rec.get("error") else None}


def build_backends(specs: list[str]) -> dict:
    """spec -> backend, or the exception that creating it raised (recorded per case)."""
    from .backends import make_backend
    out = {}
    for spec in specs:
        try:
            out[spec] = make_backend(spec)
        except Exception as e:  # noqa: BLE001 - recorded per case
            out[spec] = e
    return out


def compile_for_targets(case: Case, spec: str, backend, targets, out_dir: Path, run_id: str) -> dict | None:
    """Compile a jax candidate's program for the TPU targets; write and return its compile
    record (None for a backend that compiles nothing for TPU, or has no kernel for the case)."""
    from .backends import Unsupported, backend_name
    from .tpu_compile import compile_record
    if not targets or getattr(backend, "side", None) != "candidate" or not hasattr(backend, "compile_subject"):
        return None
    try:
        subject = backend.compile_subject(case)
    except Unsupported:
        return None
    name = backend_name(spec)
    rec = compile_record(case, spec, name, subject, targets, run_id)
    write_json(result_path(Path(out_dir), name, case.id, kind="compile"), rec)
    return rec


def run_case(case: Case, todo: list[str], backends: dict, out_dir: Path, run_id: str,
             on_start=lambda spec: None, on_done=lambda line: None,
             tpu_targets: tuple[str, ...] = ()) -> tuple[list[dict], dict, list[dict]]:
    """Run one case through the backends named in `todo` (oracle first), write a record per
    backend, compile each jax candidate for `tpu_targets`, and return (records, timing,
    compile records). Used by worker processes and the pytest plugin."""
    from cases import input_hash, make_inputs

    from .backends import BackendResult, backend_name, execute
    from .backends.oracle import cached_oracle
    t_case = time.perf_counter()
    inputs = make_inputs(case)
    h = input_hash(inputs)
    oracle = None
    backend_wall = 0.0
    records, compiles = [], []
    for spec in todo:
        name = backend_name(spec)
        on_start(spec)
        b = backends[spec]
        if isinstance(b, Exception):
            result = BackendResult(backend=name, side="candidate", status="error", tensors={},
                                   error=f"backend could not be created: {type(b).__name__}: {b}")
        elif spec != "oracle" and oracle is None and "oracle" in todo:
            result = BackendResult(backend=name, side=b.side, status="error", tensors={},
                                   error="the oracle failed for this case, nothing to compare against")
        else:
            if spec != "oracle" and oracle is None:
                oracle = cached_oracle(case, inputs)[0]
            result = execute(b, case, inputs)
            backend_wall += result.wall_time_s or 0.0
            if spec == "oracle" and result.status == "ok":
                oracle = result.tensors
        try:
            rec = _record(case, spec, result, oracle, h, run_id)
        except Exception:  # noqa: BLE001 - a comparison bug must not lose the run
            result = dataclasses.replace(result, status="error", tensors={},
                                         error="comparison failed:\n" + traceback.format_exc(limit=-4))
            rec = _record(case, spec, result, oracle, h, run_id)
        write_json(result_path(Path(out_dir), name, case.id), rec)
        records.append(rec)
        if result.status != "unsupported" and not isinstance(b, Exception):
            try:
                crec = compile_for_targets(case, spec, b, tpu_targets, out_dir, run_id)
            except Exception:  # noqa: BLE001 - a compile-check bug must not lose the run
                crec = None
                rec["notes"]["compile_check_error"] = traceback.format_exc(limit=-4)
                write_json(result_path(Path(out_dir), name, case.id), rec)
            if crec is not None:
                compiles.append(crec)
        on_done(_summary_line(rec))
    return records, {"total_s": time.perf_counter() - t_case, "backends_s": backend_wall}, compiles


def _worker_main(conn, specs: list[str], out_dir: str, run_id: str, tpu_targets: tuple[str, ...] = ()) -> None:
    """Runs cases sent over `conn`; reports ('start', case_id, spec), ('done', line), ('case', case_id, timing)."""
    backends = build_backends(specs)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        case_dict, todo = msg
        case = Case.from_dict(case_dict)
        _, timing, _ = run_case(case, todo, backends, Path(out_dir), run_id,
                                on_start=lambda spec: conn.send(("start", case.id, spec)),
                                on_done=lambda line: conn.send(("done", line)), tpu_targets=tpu_targets)
        conn.send(("case", case.id, timing))


# ------------------------------------------------------------------ parent side
class _Worker:
    def __init__(self, ctx, cfg: RunConfig):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, daemon=True,
                                args=(child, cfg.backends, str(cfg.out_dir), cfg.run_id, tuple(cfg.tpu_targets)))
        self.proc.start()
        child.close()
        self.case: Case | None = None
        self.todo: list[str] = []
        self.current: str | None = None
        self.started = 0.0

    def give(self, case: Case, todo: list[str]):
        self.case, self.todo, self.current = case, list(todo), None
        self.conn.send((case.to_dict(), todo))

    def kill(self):
        self.proc.kill()
        self.proc.join(5)


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
        fmt = lambda s: time.strftime("%M:%S", time.gmtime(s)) if s < 3600 else time.strftime("%H:%M:%S", time.gmtime(s))
        bar = "#" * int(20 * self.done / max(1, self.total))
        line = f"[{bar:<20}] {self.done}/{self.total} elapsed {fmt(el)} ETA {fmt(eta)}  {label}"
        print(("\r" + line[:150].ljust(150)) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def close(self):
        if self.enabled and self.tty:
            print(file=sys.stderr)


def _failure_line(case: Case, spec: str, status: str, error: str, cfg: RunConfig) -> dict:
    """Record written by the parent for a backend whose worker timed out or died."""
    from cases import input_hash, make_inputs

    from .backends import backend_name
    name = backend_name(spec)
    rec = base_record(case, spec, name, "oracle" if spec == "oracle" else "reference" if spec == "fla" else "candidate",
                      input_hash(make_inputs(case)), cfg.run_id)
    rec.update(status=status, verdict=status, error=error, tensors={}, platform="", implementation="",
               versions={}, kernel_time_s=None, wall_time_s=cfg.timeout_s if status == "timeout" else None, notes={})
    write_json(result_path(cfg.out_dir, name, case.id), rec)
    return _summary_line(rec)


def run_cases(cases: list[Case], cfg: RunConfig) -> dict:
    """Run every case through cfg.backends; returns the run summary (also written to summary.json)."""
    cfg.out_dir = Path(cfg.out_dir)
    cfg.run_id = cfg.run_id or uuid.uuid4().hex[:12]
    specs = ["oracle"] + [s for s in cfg.backends if s != "oracle"]
    cfg.backends = specs
    if cfg.numerics:  # workers inherit it (parity.tpu_numerics reads it on first use)
        from .tpu_numerics import ENV, check_model
        os.environ[ENV] = check_model(cfg.numerics)
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    pending = list(cases)
    lines: list[dict] = []
    timings: dict[str, dict] = {}
    workers = [_Worker(ctx, cfg) for _ in range(max(1, min(cfg.jobs, len(cases))))]
    idle = list(workers)
    busy: list[_Worker] = []
    retry: list[tuple[Case, list[str]]] = []
    progress = Progress(len(cases), cfg.progress)
    try:
        while pending or retry or busy:
            while idle and (retry or pending):
                w = idle.pop()
                case, todo = retry.pop(0) if retry else (pending.pop(0), specs)
                w.give(case, todo)
                busy.append(w)
            ready = wait([w.conn for w in busy], timeout=1.0)
            now = time.perf_counter()
            for w in list(busy):
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        msg = ("died",)
                    if msg[0] == "start":
                        w.current, w.started = msg[2], now
                    elif msg[0] == "done":
                        lines.append(msg[1])
                        w.todo.remove(w.current)
                        w.current = None
                    elif msg[0] == "case":
                        timings[msg[1]] = msg[2]
                        busy.remove(w)
                        idle.append(w)
                        progress.step(msg[1])
                        continue
                    if msg[0] != "died":
                        continue
                timed_out = w.current is not None and now - w.started > cfg.timeout_s
                died = not w.proc.is_alive() or (w.conn in ready and msg == ("died",))
                if not (timed_out or died):
                    continue
                w.kill()
                spec = w.current or (w.todo[0] if w.todo else None)
                if spec is not None:
                    status, err = (("timeout", f"no result after {cfg.timeout_s:.0f} s; worker killed") if timed_out
                                   else ("error", f"worker process died (exit code {w.proc.exitcode})"))
                    lines.append(_failure_line(w.case, spec, status, err, cfg))
                    rest = [s for s in w.todo if s != spec]
                    if spec == "oracle":
                        for s in rest:
                            lines.append(_failure_line(w.case, s, "error", "the oracle failed for this case, nothing to compare against", cfg))
                        rest = []
                    if rest:
                        retry.append((w.case, rest))
                    else:
                        progress.step(w.case.id)
                busy.remove(w)
                nw = _Worker(ctx, cfg)
                workers[workers.index(w)] = nw
                idle.append(nw)
    finally:
        progress.close()
        for w in workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in workers:
            w.proc.join(10)
            if w.proc.is_alive():
                w.kill()
    wall = time.perf_counter() - t0
    summary = {
        "schema": SCHEMA_VERSION, "kind": "run", "run_id": cfg.run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv, "backends": specs, "jobs": cfg.jobs, "cases": len(cases), "wall_time_s": wall,
        "tpu_targets": list(cfg.tpu_targets),
        "timing": _timing_summary(lines, timings, wall), "results": sorted(lines, key=lambda r: (r["case_id"], r["backend"])),
    }
    write_json(cfg.out_dir / "summary.json", summary)
    return summary


def _timing_summary(lines: list[dict], timings: dict, wall: float) -> dict:
    per_backend: dict[str, float] = {}
    for ln in lines:
        per_backend[ln["backend"]] = per_backend.get(ln["backend"], 0.0) + (ln["wall_time_s"] or 0.0)
    case_total = sum(t["total_s"] for t in timings.values())
    in_backends = sum(t["backends_s"] for t in timings.values())
    return {"per_backend_s": per_backend, "case_total_s": case_total, "in_backends_s": in_backends,
            "harness_overhead_s": case_total - in_backends,
            "harness_overhead_share": (case_total - in_backends) / case_total if case_total else None,
            "wall_s": wall}
