"""One hypothesis search of one op: Search draws cases, runs each as `parity run` does
(CaseRunner: a persistent runner worker), judges it (parity.fuzz.judgement), steers towards the
worst margins and shrinks a failure (hypothesis, then Search.simplify)."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import uuid
from pathlib import Path

from cases import Case
from cases.strategies import Space, boundary_case, shape_class, shrink_greedily, value_variant
from parity.execute.backends import backend_name, parse_specs
from parity.execute.pool import WorkerPool
from parity.execute.runner import RunConfig
from parity.execute.worker import CaseEnded, Done
from parity.fuzz.config import FuzzConfig, applies_predicate, space_for
from parity.fuzz.found import FOUND_FILE, read_found
from parity.fuzz.judgement import NOT_EVALUATED, Judgement, judge, read_records
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN

HYPOTHESIS_SHRINK_SHARE = 0.4  # of the shrink time, for hypothesis's shrinker; the rest for Search.simplify


class FuzzFailure(Exception):
    """The property failed on a case (hypothesis shrinks it)."""

    def __init__(self, case_id: str, verdict: str):
        super().__init__(f"{case_id}: {verdict}")
        self.case_id, self.verdict = case_id, verdict


class _TimeUp(BaseException):
    """The time budget ran out with nothing failing: ends hypothesis's run (not a failure)."""


# ------------------------------------------------------------------ running one case as parity run does
class CaseRunner:
    """One case at a time through a persistent runner worker (a WorkerPool of one,
    parity.execute.pool), with the per-backend timeout and the records of a worker that hangs or
    dies as in run_cases. Records land in cfg.out_dir."""

    def __init__(self, out_dir: Path, specs: list[str], timeout_s: float, run_id: str):
        self.specs = parse_specs(list(specs))
        # further input seeds only where this run gates a candidate against the reference (a search
        # draws its own seeds; no other machine's records meet these)
        gated = {"reference", "candidate"} <= {s.side for s in self.specs}
        self.cfg = RunConfig(
            out_dir=Path(out_dir),
            backends=list(specs),
            timeout_s=timeout_s,
            run_id=run_id,
            progress=False,
            seeds=(SEEDS_MIN, SEEDS_MAX) if gated else (1, 1),
        )
        self.pool: WorkerPool | None = None
        self.timing: dict = {}  # the last case's, from the worker (run_case's timing and XLA compilations)

    def run(self, case: Case) -> list[dict]:
        """The summary lines (parity.execute.case.summary_line) of every backend, oracle first."""
        if self.pool is None:
            self.pool = WorkerPool(1, self.cfg.out_dir, self.cfg.run_id, self.cfg.timeout_s, (), self.cfg.seeds)
        lines: list[dict] = []
        todo = list(self.specs)
        self.timing = {}
        while todo:
            self.pool.give(case, todo)
            todo = []
            while self.pool.busy:
                for _, event in self.pool.events(wait_s=1.0):
                    if isinstance(event, Done):
                        lines.append(event.line)
                    elif isinstance(event, CaseEnded):
                        self.timing = event.timing
                    else:  # Failed: a fresh worker runs the backends left
                        lines += event.records
                        todo = list(event.left)
        return lines

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


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
        self.counts = {"examples": 0, "unsupported": 0, "oracle-failed": 0, "cache_hits": 0, "xla_compiles": 0}
        self.compile_s = 0.0  # XLA compile seconds in the worker, over every case run
        self.class_ids: set[str] = set()  # shape classes run (cases.strategies.shape_class)
        self.drawn_while_searching: set[str] = set()  # case ids first run before a failure: they get variants
        self.case_s: dict[str, float] = {}  # case id -> seconds its run took (compiles included)
        self.variant_draws: dict[str, int] = {}  # case id -> variants drawn after it (a replay draws as many)
        self.reference_findings: list[dict] = []
        self.platforms: set[str] = set()  # where the subject really ran, from its records
        self.runner: CaseRunner | None = None
        self.t0 = self.t_found = None
        self.examples_to_find: int | None = None  # examples run until the first failure, it included

    # the property
    def check(self, case: Case, data, space: Space) -> None:
        """The gate's verdict on `case`, then on cfg.variants value variants of it (cases.strategies
        .value_variant, drawn from `data`: the same shapes, so the programs compiled for `case` run
        them); FuzzFailure at the first that fails. Variants are drawn for a case first run while
        searching, not while shrinking (each step of the shrinker is then one case), and for the same
        case always alike, so that hypothesis replays a failure as it found it."""
        import hypothesis

        j = self.judged(case)
        if j.verdict in NOT_EVALUATED:
            hypothesis.reject()
        margins = {name: dict(m) for name, m in j.margins.items()}
        if j.failed:
            raise FuzzFailure(case.id, j.verdict)
        if case.id not in self.drawn_while_searching:
            return self.steer(margins)
        budget = self.cfg.variant_share * self.case_s.get(case.id, 0.0)
        replay = self.variant_draws.get(case.id)  # as many draws as when it was first run
        draws, spent, ids = 0, 0.0, {case.id}
        while (
            draws < replay
            if replay is not None
            else draws < 3 * self.cfg.variants and len(ids) <= self.cfg.variants and spent < budget
        ):
            v = data.draw(value_variant(space, case), label="variant")
            draws += 1
            if v.id in ids:  # a draw that repeats a case is skipped
                continue
            ids.add(v.id)
            t = time.perf_counter()
            jv = self.judged(v)
            spent += time.perf_counter() - t
            if jv.failed:
                self.variant_draws.setdefault(case.id, draws)
                raise FuzzFailure(v.id, jv.verdict)
            for name, m in jv.margins.items():
                worst = margins.setdefault(name, {})
                for kind, x in m.items():
                    if x is not None and (worst.get(kind) is None or x > worst[kind]):
                        worst[kind] = x
        self.variant_draws.setdefault(case.id, draws)
        self.steer(margins)

    @staticmethod
    def steer(margins: dict) -> None:
        """hypothesis.target towards the largest eps/tol and eps/bound per tensor (once per label)."""
        import hypothesis

        for name, m in sorted(margins.items()):
            for kind, x in m.items():
                if x is not None and math.isfinite(x):
                    hypothesis.target(x, label=f"{name} {kind}")

    def judged(self, case: Case) -> Judgement:
        """The case's judgement: remembered, else run (hypothesis.reject while shrinking out of time;
        _TimeUp when the search's time is up)."""
        import hypothesis

        j = self.seen.get(case.id)
        if j is not None:
            self.counts["cache_hits"] += 1
            return j
        now = time.perf_counter()
        if self.t_found is None and now - self.t0 > self.cfg.time_s:
            raise _TimeUp()
        if self.t_found is not None and now - self.t_found > HYPOTHESIS_SHRINK_SHARE * self.cfg.shrink_time_s:
            hypothesis.reject()  # shrinking out of time: only cases already run still count
        if self.t_found is None:
            self.drawn_while_searching.add(case.id)
        return self.evaluate(case)

    def evaluate(self, case: Case) -> Judgement:
        t = time.perf_counter()
        records = read_records(self.work, case, self.runner.run(case))
        self.case_s[case.id] = time.perf_counter() - t
        self.counts["xla_compiles"] += self.runner.timing.get("xla_compiles", 0)
        self.compile_s += self.runner.timing.get("xla_compile_s", 0.0)
        j = judge(case, records, self.cfg.subject, self.cfg.factor)
        if j.verdict not in NOT_EVALUATED:
            self.class_ids.add(shape_class(case).id)
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
        from hypothesis import strategies as st
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
        @given(boundary_case(space, applies), st.data())
        def prop(case, data):
            self.check(case, data, space)

        self.t0 = time.perf_counter()
        minimal, stopped = None, "max-examples"
        try:
            try:
                for case in self.earlier_failures(space, applies):  # a rerun tries them first
                    j = self.judged(case)
                    if j.failed:
                        raise FuzzFailure(case.id, j.verdict)
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
            "variants": self.cfg.variants,
            "shape_classes": len(self.class_ids),
            "xla_compile_s": self.compile_s,
            "work": str(self.work),
        }

    def earlier_failures(self, space: Space, applies) -> list[Case]:
        """The cases of OUT/found.json this search could draw (its op, within the space, where the
        subject has a kernel): a rerun tries them before anything else."""
        out = []
        for d in read_found(Path(self.cfg.out) / FOUND_FILE):
            c = Case.from_dict(d)
            if c.op == self.op and in_space(c, space) and (applies is None or applies(c)):
                out.append(c)
        return out


def in_space(case: Case, space: Space) -> bool:
    """Whether `case` is one the space's axes and bounds allow."""
    return (
        case.dtype in space.dtypes
        and case.K in space.k_dims
        and case.V in space.v_dims
        and case.gate in space.gates
        and case.chunk_size in space.chunk_sizes
        and case.direction in space.directions
        and case.H <= space.max_H
        and case.T <= space.max_T
        and space.fits(case)
    )


def database_dir(cfg: FuzzConfig, op: str) -> Path:
    """hypothesis's example database of this op, subject and backends (under OUT)."""

    key = "-".join([op, cfg.subject] + [backend_name(s) for s in cfg.backends if s != "oracle"])
    return Path(cfg.out) / ".hypothesis" / key
