"""`parity fuzz`: a hypothesis search over the case space for the failing case no suite names,
shrunk to the smallest one.

Each example is a Case drawn by `cases.strategies.boundary_case` (lengths at the chunk grid,
one-token tails, length-1 packed sequences, tile-edge head dims, H > 2, K != V, gates into
the overflow regime), in a space narrowed to where the candidate has a kernel and bounded by
`max_elements`. It runs exactly as `parity run` runs a case: in a runner worker process
(`parity.runner.run_case`: oracle first, one record per backend, the comparator and `_tol`),
with the per-backend timeout; a worker that hangs or dies costs that backend's record, which
says so. The property is the gate's own verdict for the subject:
    a candidate, with the reference (fla) among the backends   parity.gate.evaluate: tolerance,
                                                              the TPU <= GPU bound, NaN/Inf, error, timeout
    a candidate, without a reference                          its record's verdict (as `parity run`)
    no candidate, backends oracle,fla                         FLA's record: findings about the reference
Anything but pass fails the example (a crash, a timeout, an unserialisable result included);
`unsupported` (no kernel) and a case the oracle could not compute are not evaluated
(hypothesis rejects them; the summary counts them). A failure is shrunk by hypothesis to
the smallest failing case, then one field at a time (Search.simplify: B = 1, fewer sequences and
heads, smaller dims and T, ... each a single run, where hypothesis's generic shrinker spends many
runs on one field). While nothing fails, `hypothesis.target` steers towards the
largest eps/tol and eps/bound ratios per tensor (ratios of the numbers the gate computed),
and the worst margin per op, dtype and tensor is reported.

Time: the search stops drawing at `time_s`; shrinking a failure has `shrink_time_s` more
(HYPOTHESIS_SHRINK_SHARE of it for hypothesis's shrinker, the rest for Search.simplify).
Outputs under OUT:
    found.json            every minimal failing case found (a JSON list of case dicts, appended;
                          `parity run --cases OUT/found.json` replays it)
    found/<case_id>/      its records and manifest (`parity gate` reads it) and repro/ (`parity repro`)
    fuzz.json             the summary: searches, examples, failures, time to find, worst margins
    fuzz.html             the page of found cases and worst margins (parity.html.fuzz)
    .hypothesis/          hypothesis's example database, so a rerun tries earlier failures first
A candidate function may carry `applies(case) -> bool` (parity.mutants.narrow' do) to say
where it has a kernel; built-in kernels and mutants are asked through their backend.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import shutil
import sys
import time
import uuid
from multiprocessing.connection import wait
from pathlib import Path

from cases import Case
from cases.strategies import Space, boundary_case, shrink_greedily

DEFAULT_MAX_ELEMENTS = 2**18  # a few seconds per example in TPU interpret mode on a CPU
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_SHRINK_TIME_S = 300.0
HYPOTHESIS_SHRINK_SHARE = 0.4  # of the shrink time, for hypothesis's shrinker; the rest for Search.simplify
REFERENCE = "fla"
NOT_EVALUATED = ("unsupported", "oracle-failed")
FOUND_FILE = "found.json"


class FuzzFailure(Exception):
    """The property failed on a case (hypothesis shrinks it)."""

    def __init__(self, case_id: str, verdict: str):
        super().__init__(f"{case_id}: {verdict}")
        self.case_id, self.verdict = case_id, verdict


class _TimeUp(BaseException):
    """The time budget ran out with nothing failing: ends hypothesis's run (not a failure)."""


@dataclasses.dataclass
class FuzzConfig:
    out: Path
    ops: tuple[str, ...]
    backends: tuple[str, ...] = ("oracle",)  # oracle first; with 'fla' the bound is enforced
    candidate: str | None = None  # the spec searched; None: the reference itself
    time_s: float = 60.0  # per op and search, to draw examples
    shrink_time_s: float = DEFAULT_SHRINK_TIME_S
    max_examples: int = 10**6
    seed: int = 0
    jobs: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_elements: int = DEFAULT_MAX_ELEMENTS
    factor: float = 1.0
    progress: bool = True
    numerics: str = ""  # TPU numerics model of jax candidates ("" = default), as parity run
    space: dict = dataclasses.field(default_factory=dict)  # Space fields to fix (tests: directions=("fwd",))

    @property
    def specs(self) -> list[str]:
        return ["oracle"] + [s for s in self.backends if s != "oracle"] + ([self.candidate] if self.candidate else [])

    @property
    def subject(self) -> str:
        """The backend name whose verdict is the property."""
        from .backends import backend_name

        return backend_name(self.candidate) if self.candidate else REFERENCE


# ------------------------------------------------------------------ where the subject applies
def applies_predicate(spec: str):
    """case -> bool: whether the backend has a kernel for the case (None: it does not say).
    Built-in kernels and mutants answer through compile_subject (Unsupported); a candidate
    function through its `applies` attribute, if it has one."""
    from .backends import Unsupported, make_backend
    from .backends.jax_backends import PallasBackend
    from .backends.mutant import MutantBackend

    if spec in ("oracle", REFERENCE):
        return None
    backend = make_backend(spec)
    fn_applies = getattr(getattr(backend, "fn", None), "applies", None)
    if callable(fn_applies):
        return fn_applies
    if not isinstance(backend, (PallasBackend, MutantBackend)):
        return None

    def applies(case: Case) -> bool:
        try:
            backend.compile_subject(case)
        except Unsupported:
            return False
        return True

    return applies


def space_for(op: str, applies, max_elements: int, **fixed) -> Space:
    """The Space of `op` narrowed, axis by axis, to the values `applies` accepts (probed on a
    small case); ValueError naming the op when it accepts none. `fixed` overrides fields."""
    base = Space(op=op, max_elements=max_elements, **fixed)
    if applies is None:
        return base
    probe = next(
        (Case(op, 1, 16, 1, 64, 64, gate=g) for g in base.gates if applies(Case(op, 1, 16, 1, 64, 64, gate=g))), None
    )
    if probe is None:
        raise ValueError(f"the candidate has no kernel for op {op!r} at any gate (probed at K = V = 64)")
    ok = lambda **kw: applies(probe.replace(**kw))
    fields = dict(
        gates=tuple(g for g in base.gates if ok(gate=g)),
        dtypes=tuple(d for d in base.dtypes if ok(dtype=d)),
        k_dims=tuple(d for d in base.k_dims if ok(K=d)),
        v_dims=tuple(d for d in base.v_dims if ok(V=d)),
        chunk_sizes=tuple(c for c in base.chunk_sizes if ok(chunk_size=c)),
    )
    empty = [f for f, v in fields.items() if not v]
    if empty:
        raise ValueError(f"the candidate has no kernel for op {op!r}: no value of {', '.join(empty)} is accepted")
    return dataclasses.replace(base, **fields)


# ------------------------------------------------------------------ running one case as parity run does
class CaseRunner:
    """One case at a time through a persistent runner worker (parity.runner._worker_main, which
    calls run_case); the per-backend timeout and the records of a worker that hangs or dies
    as in run_cases (parity.runner._Worker.poll and .fail). Records land in cfg.out_dir."""

    def __init__(self, out_dir: Path, specs: list[str], timeout_s: float, run_id: str):
        from .backends import parse_specs
        from .runner import RunConfig

        self.cfg = RunConfig(
            out_dir=Path(out_dir), backends=list(specs), timeout_s=timeout_s, run_id=run_id, progress=False
        )
        self.specs = parse_specs(list(specs))
        self.ctx = mp.get_context("spawn")
        self.worker = None

    def run(self, case: Case) -> list[dict]:
        """The summary lines (parity.runner._summary_line) of every backend, oracle first."""
        from .runner import _Worker

        lines: list[dict] = []
        todo = list(self.specs)
        while todo:
            if self.worker is None:
                self.worker = _Worker(self.ctx, Path(self.cfg.out_dir), self.cfg.run_id, ())
            w = self.worker
            w.give(case, todo)
            while True:
                event = w.poll(bool(wait([w.conn], timeout=1.0)), self.cfg.timeout_s)
                if event is None:
                    continue
                kind, value = event
                if kind == "done":
                    lines.append(value)
                    continue
                if kind == "case":
                    if w.retired:
                        self.worker = None
                    return lines
                self.worker = None
                failed, todo = w.fail(*value, self.cfg.timeout_s)
                lines += failed
                break
        return lines

    def close(self) -> None:
        if self.worker is not None:
            try:
                self.worker.conn.send(None)
                self.worker.proc.join(10)
            except (OSError, BrokenPipeError):
                pass
            if self.worker.proc.is_alive():
                self.worker.kill()
            self.worker = None


# ------------------------------------------------------------------ the property: the gate's verdict
@dataclasses.dataclass
class Judgement:
    verdict: str  # the gate's verdict for the subject, or one of NOT_EVALUATED
    detail: str = ""
    margins: dict = dataclasses.field(default_factory=dict)  # tensor -> {"eps/tol": x, "eps/bound": y}
    reference_findings: list = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.verdict not in ("pass",) + NOT_EVALUATED


def read_records(out_dir: Path, case: Case, lines: list[dict]) -> dict[str, dict]:
    """backend -> the record each summary line points to, read and checked as the gate reads
    them; a record that was not written or does not read back is an error record."""
    from .records import RecordError, check_result, read_checked, result_path

    recs = {}
    for ln in lines:
        name = ln["backend"]
        try:
            if ln.get("written") is False:
                raise RecordError(f"record not written: {ln.get('error')}")
            rec = read_checked(result_path(out_dir, name, case.id))
            check_result(rec, result_path(out_dir, name, case.id))
        except RecordError as e:
            rec = {
                "backend": name,
                "side": ln["side"],
                "status": "error",
                "verdict": "error",
                "tensors": {},
                "error": f"the record cannot be read back: {e}",
            }
        recs[name] = rec
    return recs


def _ratio(x, limit) -> float | None:
    """x / limit; inf for a missing x (NaN/Inf); None when the limit is not a positive number."""
    if not isinstance(limit, (int, float)) or not limit > 0:
        return None
    return math.inf if x is None else x / limit


def judge(case: Case, records: dict[str, dict], subject: str, factor: float = 1.0) -> Judgement:
    """The gate's verdict for `subject` on one case, and its margins per tensor."""
    from .gate import GateRefusal, evaluate

    oracle = records.get("oracle")
    rec = records.get(subject)
    if oracle is None or oracle["status"] != "ok":
        return Judgement("oracle-failed", (oracle or {}).get("error") or "no oracle record")
    if rec is None:
        return Judgement("error", f"no record for {subject}")
    if rec["status"] == "unsupported":
        return Judgement("unsupported", rec.get("error") or "")
    if rec["status"] != "ok":
        first_line = (rec.get("error") or "").strip().splitlines()[:1]
        return Judgement(rec["verdict"], first_line[0][:300] if first_line else "")
    if rec["side"] == "candidate" and REFERENCE in records:
        try:
            gate = evaluate({case.id: records}, factor, reference=REFERENCE)
        except GateRefusal as e:
            return Judgement("error", f"the gate refused the case: {e}")
        entry = next(e for e in gate["cases"] if e["candidate"] == subject)
        margins = {}
        for name, t in entry["tensors"].items():
            b = t.get("bound") or {}
            bounds = [_ratio(b[m]["candidate"], b[m]["limit"]) for m in ("rel_rms", "max_abs") if b.get(m)]
            bounds = [x for x in bounds if x is not None]
            margins[name] = {
                "eps/tol": _ratio(t.get("rel_rms"), t.get("tol")),
                "eps/bound": max(bounds) if bounds else None,
            }
        bad = [
            f"{n} {t['verdict']}" for n, t in entry["tensors"].items() if t["verdict"] not in ("pass", "unsupported")
        ]
        return Judgement(entry["verdict"], ", ".join(bad), margins, gate["reference_findings"])
    margins = {
        n: {"eps/tol": _ratio(t.get("rel_rms"), t.get("tol")), "eps/bound": None}
        for n, t in rec["tensors"].items()
        if t.get("verdict") != "unsupported"
    }
    bad = [f"{n} {t['verdict']}" for n, t in rec["tensors"].items() if t["verdict"] not in ("pass", "unsupported")]
    return Judgement(rec["verdict"], ", ".join(bad), margins)


# ------------------------------------------------------------------ one search
class Search:
    """One hypothesis search of one op with one seed; `run()` returns its summary."""

    def __init__(self, cfg: FuzzConfig, op: str, index: int = 0):
        self.cfg, self.op, self.index = cfg, op, index
        self.seed = cfg.seed + index
        self.work = Path(cfg.out) / ".work" / f"{op}-{index}"
        self.run_id = f"fuzz-{uuid.uuid4().hex[:10]}"
        self.seen: dict[str, Judgement] = {}
        self.failing: list[str] = []  # failing case ids in the order found
        self.worst: dict[str, dict] = {}  # "dtype/tensor/kind" -> {"margin", "case_id"}
        self.counts = {"examples": 0, "unsupported": 0, "oracle-failed": 0, "cache_hits": 0}
        self.reference_findings: list[dict] = []
        self.platforms: set[str] = set()  # where the subject really ran, from its records
        self.runner: CaseRunner | None = None
        self.t0 = self.t_found = None
        self.examples_to_find: int | None = None  # examples run until the first failure, it included

    # the property
    def check(self, case: Case) -> None:
        import hypothesis

        j = self.seen.get(case.id)
        if j is None:
            now = time.perf_counter()
            if self.t_found is None and now - self.t0 > self.cfg.time_s:
                raise _TimeUp()
            if self.t_found is not None and now - self.t_found > HYPOTHESIS_SHRINK_SHARE * self.cfg.shrink_time_s:
                hypothesis.reject()  # shrinking out of time: only cases already run still count
            j = self.evaluate(case)
        else:
            self.counts["cache_hits"] += 1
        if j.verdict in NOT_EVALUATED:
            hypothesis.reject()
        for name, m in sorted(j.margins.items()):
            for kind, x in m.items():
                if x is not None and math.isfinite(x):
                    hypothesis.target(x, label=f"{name} {kind}")
        if j.failed:
            raise FuzzFailure(case.id, j.verdict)

    def evaluate(self, case: Case) -> Judgement:
        records = read_records(self.work, case, self.runner.run(case))
        j = judge(case, records, self.cfg.subject, self.cfg.factor)
        if records.get(self.cfg.subject, {}).get("platform"):
            self.platforms.add(records[self.cfg.subject]["platform"])
        self.seen[case.id] = j
        if j.verdict in NOT_EVALUATED:
            self.counts[j.verdict] += 1
        else:
            self.counts["examples"] += 1
        for f in j.reference_findings:
            self.reference_findings.append(f)
        for name, m in j.margins.items():
            for kind, x in m.items():
                key = f"{case.dtype}/{name}/{kind}"
                if x is not None and (key not in self.worst or x > self.worst[key]["margin"]):
                    self.worst[key] = {"margin": x, "case_id": case.id}
        if j.failed:
            self.failing.append(case.id)
            if self.t_found is None:
                self.t_found = time.perf_counter()
                self.examples_to_find = self.counts["examples"]
        self._progress(case, j)
        return j

    def simplify(self, case_id: str, space: Space, applies) -> str:
        """After hypothesis's shrinking: one field at a time (cases.strategies.shrink_greedily), each
        simpler case run like any example, until none fails or the shrink time is up; the smallest id."""
        deadline = self.t_found + self.cfg.shrink_time_s

        def fails(c: Case) -> bool:
            if applies is not None and not applies(c):
                return False
            return (self.seen.get(c.id) or self.evaluate(c)).failed

        return shrink_greedily(Case.from_id(case_id), space, fails, lambda: time.perf_counter() >= deadline).id

    def _progress(self, case: Case, j: Judgement) -> None:
        if not self.cfg.progress:
            return
        worst = max(self.worst.items(), key=lambda kv: kv[1]["margin"], default=None)
        w = f"worst {worst[0]} {worst[1]['margin']:.3g}" if worst else "worst -"
        el = time.perf_counter() - self.t0
        left = (
            f"shrinking, {max(0.0, self.cfg.shrink_time_s - (time.perf_counter() - self.t_found)):.0f} s left"
            if self.t_found is not None
            else f"{max(0.0, self.cfg.time_s - el):.0f} s left"
        )
        print(
            f"fuzz {self.op}[{self.cfg.subject}] #{self.index}: {self.counts['examples']} examples, "
            f"{len(self.failing)} failing, {w}, {left}  ({j.verdict} {case.id})",
            file=sys.stderr,
            flush=True,
        )

    def run(self) -> dict:
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as hseed
        from hypothesis.database import DirectoryBasedExampleDatabase
        from hypothesis.errors import Unsatisfiable

        applies = applies_predicate(self.cfg.candidate) if self.cfg.candidate else None
        space = space_for(self.op, applies, self.cfg.max_elements, **self.cfg.space)
        db = DirectoryBasedExampleDatabase(str(database_dir(self.cfg, self.op)))
        self.runner = CaseRunner(self.work, self.cfg.specs, self.cfg.timeout_s, self.run_id)

        @settings(
            database=db,
            max_examples=self.cfg.max_examples,
            deadline=None,
            verbosity=Verbosity.quiet,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
        )
        @hseed(self.seed)
        @given(boundary_case(space, applies))
        def prop(case):
            self.check(case)

        self.t0 = time.perf_counter()
        minimal, stopped = None, "max-examples"
        try:
            try:
                prop()
            except FuzzFailure as e:
                minimal, stopped = e.case_id, "failure"
            except _TimeUp:
                stopped = "time"
            except Unsatisfiable:
                stopped = "nothing evaluated (every drawn case unsupported or without an oracle)"
            if minimal is not None:
                minimal = self.simplify(minimal, space, applies)
        finally:
            self.runner.close()
        wall = time.perf_counter() - self.t0
        return {
            "op": self.op,
            "index": self.index,
            "seed": self.seed,
            "subject": self.cfg.subject,
            "space": dataclasses.asdict(space),
            "stopped": stopped,
            "wall_s": wall,
            **self.counts,
            "failing": self.failing,
            "minimal": minimal,
            "minimal_verdict": self.seen[minimal].verdict if minimal else None,
            "minimal_detail": self.seen[minimal].detail if minimal else None,
            "time_to_find_s": self.t_found - self.t0 if self.t_found is not None else None,
            "examples_to_find": self.examples_to_find,
            "shrink_s": time.perf_counter() - self.t_found if self.t_found is not None else None,
            "worst": self.worst,
            "reference_findings": self.reference_findings,
            "platforms": sorted(self.platforms),
            "work": str(self.work),
        }


def database_dir(cfg: FuzzConfig, op: str) -> Path:
    """hypothesis's example database of this op, subject and backends (under OUT)."""
    from .backends import backend_name

    key = "-".join([op, cfg.subject] + [backend_name(s) for s in cfg.backends if s != "oracle"])
    return Path(cfg.out) / ".hypothesis" / key


def _search_in_child(cfg: FuzzConfig, op: str, index: int, conn) -> None:
    from .proc import die_with_parent

    die_with_parent()
    try:
        conn.send(("ok", Search(cfg, op, index).run()))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        import traceback

        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}"))


def run_searches(cfg: FuzzConfig, op: str) -> list[dict]:
    """cfg.jobs independent searches of `op` (seeds seed, seed + 1, ...), in worker processes
    when jobs > 1."""
    if cfg.jobs == 1:
        return [Search(cfg, op, 0).run()]
    ctx = mp.get_context("spawn")
    procs = []
    for i in range(cfg.jobs):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_search_in_child, args=(cfg, op, i, child))
        p.start()
        child.close()
        procs.append((p, parent))
    results = []
    try:
        for i, (p, conn) in enumerate(procs):
            try:
                status, value = conn.recv()
            except EOFError:
                status, value = "error", f"search process died (exit code {p.exitcode})"
            p.join()
            if status != "ok":
                raise RuntimeError(f"search {op} #{i} failed: {value}")
            results.append(value)
    finally:
        for p, _ in procs:
            if p.is_alive():
                p.kill()
    return results


# ------------------------------------------------------------------ outputs
def save_found(cfg: FuzzConfig, search: dict) -> dict:
    """For a search's minimal failing case: its records and a manifest in OUT/found/<id>/, the
    repro bundle in OUT/found/<id>/repro/, and its case dict appended to OUT/found.json."""
    from .backends import backend_name
    from .manifest import write_manifest
    from .records import read_json, result_path
    from .repro import write_repro

    case = Case.from_id(search["minimal"])
    dest = Path(cfg.out) / "found" / case.id
    names = []
    for spec in cfg.specs:
        name = backend_name(spec)
        src = result_path(Path(search["work"]), name, case.id)
        if src.exists():
            result_path(dest, name, case.id).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, result_path(dest, name, case.id))
            names.append(name)
    oracle = result_path(dest, "oracle", case.id)
    hashes = {case.id: read_json(oracle).get("input_hash")} if oracle.exists() else {}
    write_manifest(
        dest, "fuzz", "parity fuzz", [case.id], names, hashes, completed={(case.id, n) for n in names}, finished=True
    )
    subject = cfg.candidate or REFERENCE
    try:
        write_repro(case, subject, dest / "repro")
        repro = str(dest / "repro")
    except (ValueError, KeyError) as e:
        repro = f"not written: {e}"
    append_found(Path(cfg.out) / FOUND_FILE, case)
    return {
        "case_id": case.id,
        "op": case.op,
        "subject": search["subject"],
        "verdict": search["minimal_verdict"],
        "detail": search["minimal_detail"],
        "records": str(dest),
        "repro": repro,
        "time_to_find_s": search["time_to_find_s"],
        "seed": search["seed"],
    }


def read_found(path: Path) -> list[dict]:
    """OUT/found.json's case dicts ([] when absent); ValueError naming the file when it is not
    a JSON list of valid case dicts."""
    from cases import CaseError, load_cases_file

    if not path.exists():
        return []
    try:
        cases = load_cases_file(path)
    except CaseError as e:
        raise ValueError(f"{path} is not a list of cases `parity run --cases` reads: {e}") from None
    return [c.to_dict() for c in cases]


def append_found(path: Path, case: Case) -> None:
    from .records import write_json

    found = read_found(path)
    if case.to_dict() not in found:
        found.append(case.to_dict())
    write_json(path, found)


def merge_worst(searches: list[dict]) -> dict:
    """op -> "dtype/tensor/kind" -> the worst margin over the searches, and where."""
    out: dict[str, dict] = {}
    for s in searches:
        for key, w in s["worst"].items():
            cur = out.setdefault(s["op"], {}).get(key)
            if cur is None or w["margin"] > cur["margin"]:
                out[s["op"]][key] = w
    return out


def run_fuzz(cfg: FuzzConfig) -> dict:
    """Every op's searches; writes found/, found.json, fuzz.json and fuzz.html; returns the summary."""
    from .records import write_json

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    read_found(out / FOUND_FILE)  # refuse a malformed found.json before searching
    if cfg.numerics:  # workers inherit it (parity.tpu_numerics reads it on first use), as in run_cases
        from .tpu_numerics import ENV, check_model

        os.environ[ENV] = check_model(cfg.numerics)
    t0 = time.perf_counter()
    searches = []
    for op in cfg.ops:
        searches += run_searches(cfg, op)
    found, seen = [], set()
    for s in searches:
        if s["minimal"] and s["minimal"] not in seen:
            seen.add(s["minimal"])
            found.append(save_found(cfg, s))
    for s in searches:
        shutil.rmtree(s["work"], ignore_errors=True)
    shutil.rmtree(out / ".work", ignore_errors=True)
    summary = {
        "kind": "fuzz",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
        "subject": cfg.subject,
        "candidate": cfg.candidate,
        "backends": list(cfg.specs),
        "reference_searched": cfg.candidate is None,
        "ops": list(cfg.ops),
        "jobs": cfg.jobs,
        "time_s": cfg.time_s,
        "shrink_time_s": cfg.shrink_time_s,
        "max_elements": cfg.max_elements,
        "seed": cfg.seed,
        "wall_s": time.perf_counter() - t0,
        "platforms": sorted({p for s in searches for p in s["platforms"]}),
        "found": found,
        "worst": merge_worst(searches),
        "searches": [{k: v for k, v in s.items() if k not in ("worst", "work")} for s in searches],
    }
    write_json(out / "fuzz.json", _finite(summary))
    try:
        from .html.fuzz import write_page

        summary["page"] = str(write_page(summary, out / "fuzz.html"))
    except ImportError:
        summary["page"] = None
    return summary


def _finite(obj):
    """inf margins (NaN/Inf outputs) as the string 'inf' for JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def format_summary(summary: dict) -> str:
    """The terminal report; a failure's minimal case id is the last line."""
    lines = []
    who = (
        f"the reference ({summary['subject']}) against the oracle"
        if summary["reference_searched"]
        else f"candidate {summary['subject']}"
    )
    for s in summary["searches"]:
        lines.append(
            f"fuzz {s['op']} #{s['index']} (seed {s['seed']}): {who}: {s['examples']} examples in "
            f"{s['wall_s']:.0f} s ({s['unsupported']} unsupported, {s['oracle-failed']} oracle failures not "
            f"evaluated); stopped by {s['stopped']}"
            + (
                f"; failure found after {s['time_to_find_s']:.0f} s ({s['examples_to_find']} examples), "
                f"shrunk in {s['shrink_s']:.0f} s "
                f"over {len(s['failing'])} failing cases"
                if s["minimal"]
                else ""
            )
        )
    for op, worst in summary["worst"].items():
        lines.append(f"worst margins, {op} (eps / limit; > 1 fails):")
        for key in sorted(worst):
            w = worst[key]
            lines.append(f"  {key:28s} {w['margin']:.3g}  {w['case_id']}")
    for f in summary["found"]:
        kind = "FINDING about the reference" if summary["reference_searched"] else "FAIL"
        lines.append(
            f"{kind} [{f['subject']}] {f['verdict']}: {f['detail']}\n  records: {f['records']}\n  repro: {f['repro']}"
        )
    if summary["found"]:
        lines.append(
            f"found.json: {Path(summary['found'][0]['records']).parents[1] / FOUND_FILE} "
            f"(parity run --cases replays it)"
        )
        lines.append(summary["found"][-1]["case_id"])
    else:
        lines.append(f"fuzz: no failure in {sum(s['examples'] for s in summary['searches'])} examples")
    return "\n".join(lines)


# ------------------------------------------------------------------ pytest entry
def fuzz_for_pytest(config, op: str) -> tuple[bool, str]:
    """The search `pytest --parity-fuzz SECONDS` runs for one op against the built-in kernel
    (pallas) or the first --candidate: (passed, report)."""
    from .pytest_plugin import _bound_factor, _report_dir

    opt = config.getoption
    candidate = (opt("parity_candidate") or ["pallas"])[0]
    out = _report_dir(config) / "fuzz" / f"{op}-{os.getpid()}"
    cfg = FuzzConfig(
        out=out,
        ops=(op,),
        candidate=candidate,
        time_s=float(opt("parity_fuzz")),
        factor=_bound_factor(config),
        progress=False,
    )
    summary = run_fuzz(cfg)
    return not summary["found"], format_summary(summary)


__all__ = [
    "FuzzConfig",
    "run_fuzz",
    "format_summary",
    "judge",
    "space_for",
    "applies_predicate",
    "CaseRunner",
    "fuzz_for_pytest",
    "DEFAULT_MAX_ELEMENTS",
]
