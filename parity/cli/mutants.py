"""`parity mutants`: run the catalogue (parity.mutants) beside the unmutated kernels
and FLA through the gate, and score which cases and checks caught each mutant.

By default a mutant stops at the first case that catches it (`MutantSchedule`): it tries its
op's cases of the selection one after another, its witness first when the selection holds it,
then the cases most like the witness (parity.mutants.order), and goes on to its next case only
while the gate passes it. Every case runs once with the oracle, FLA and the unmutated kernels
(pallas, pallas-fused) and the mutants whose first case it is; a mutant's later cases join that
case's first unit while it waits, or run after it (inputs drawn again, the oracle from its cache,
FLA's record already written). `--all-cases` runs every mutant on every case of its op instead:
the full catch matrix. The run's manifest lists exactly the (case, backend) pairs planned, so
`parity gate` on the output refuses any record a mutant was meant to write and did not.
"""

from __future__ import annotations

import sys
import uuid
from collections import defaultdict
from pathlib import Path

from cases import Case
from parity.cli import args as check
from parity.cli.common import (
    UsageError,
    bound_factor_option,
    interpret_as_option,
    interrupted_status,
    prepare_out,
    select_cases,
    selection_options,
    tpu_options,
    tpu_targets,
    write_report,
)
from parity.execute.runner import RunConfig, Schedule, run_cases
from parity.execute.tpu_identity import choose, exported
from parity.judge.case import judge_case
from parity.judge.gate import evaluate, load_checked
from parity.measure.compare import describe_localisation
from parity.model.host import tpu_attached
from parity.model.spec import MUTANT_PREFIX, REFERENCE
from parity.mutants import BY_NAME, CATALOGUE, Mutant, catalogue_json
from parity.mutants.order import case_order, cost
from parity.records import (
    UNBOUNDED_REFERENCE,
    RecordError,
    check_compile,
    check_result,
    read_checked,
    result_path,
    write_json,
)


def add_parser(sub) -> None:
    sp = sub.add_parser("mutants", help="run the catalogue of mutant kernels and score what the harness catches")
    selection_options(sp, single=True)
    sp.add_argument(
        "--out",
        metavar="DIR",
        type=check.output_dir,
        default="reports/mutants",
        help="output directory (default reports/mutants)",
    )
    sp.add_argument("--only", metavar="NAME", action="append", help="run only this mutant (repeatable)")
    sp.add_argument(
        "--all-cases",
        action="store_true",
        help="run every mutant on every case of its op (the full catch matrix); default: stop each "
        "mutant at the first case that catches it",
    )
    sp.add_argument("--list", action="store_true", help="print the catalogue as JSON and exit")
    sp.add_argument("-j", "--jobs", metavar="N", type=check.positive_int, default=1, help="parallel worker processes")
    sp.add_argument(
        "--timeout", metavar="S", type=check.seconds, default=900.0, help="seconds per backend call before it is killed"
    )
    bound_factor_option(sp)
    sp.add_argument("--no-html", action="store_true", help="do not write index.html")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    tpu_options(sp)
    interpret_as_option(sp)
    sp.set_defaults(fn=cmd_mutants)


def cmd_mutants(a) -> int:
    if a.list:
        print(catalogue_json())
        return 0
    for n in a.only or []:
        if n not in BY_NAME:
            raise UsageError(f"--only {n!r}: expected one of {sorted(BY_NAME)}")
    if not (a.suite or a.cases or a.case):
        a.suite = "ci"
    cases = select_cases(a)
    if not cases:
        raise UsageError("no cases selected")
    targets = tpu_targets(a)
    out = prepare_out(Path(a.out))
    print(
        f"parity mutants: {len(cases)} cases -> {out}; "
        + ("every mutant on every case of its op" if a.all_cases else "each mutant stops at its first catch"),
        file=sys.stderr,
    )
    with exported(None if tpu_attached() else choose(a.tpu_interpret_as, targets)):  # workers read it
        result = run_mutants(
            cases,
            out,
            jobs=a.jobs,
            timeout_s=a.timeout,
            factor=a.bound_factor,
            names=a.only,
            progress=not a.no_progress,
            tpu_targets=targets,
            all_cases=a.all_cases,
        )
    if result.get("interrupted"):
        print(
            f"parity mutants: interrupted by {result['interrupted']}: not scored; "
            f"the gate refuses {out} until the rest is run",
            file=sys.stderr,
        )
        return interrupted_status(result["interrupted"])
    print(format_score(result))
    if not a.no_html:
        page = write_report([out], out / "index.html")
        if page:
            print(f"report: {page.resolve()}")
    return 0 if result["caught"] == result["total"] and not result["unmutated_failures"] else 1


NOT_A_CATCH = ("pass", "unsupported", UNBOUNDED_REFERENCE)  # unbounded-reference: the reference's environment's


def _caught(entry: dict) -> bool:
    """Whether a gate entry of a mutant catches it: any verdict but NOT_A_CATCH's (a tensor the
    reference's environment left unbounded says nothing of the mutant)."""
    return entry["verdict"] not in NOT_A_CATCH


class MutantSchedule(Schedule):
    """The units of `parity mutants`: every case once with the backends that are not mutants
    (FLA, pallas, pallas-fused) and the mutants whose first case it is; a mutant the gate passes
    on a case goes on to its next case (parity.mutants.order.case_order), one the gate fails
    (caught) stops. A mutant's next case joins that case's first unit while it is queued (which
    then runs next), waits while it runs (FLA's record must exist to judge the bound), and
    otherwise runs as a unit of its own, ahead of the queue. `all_cases`: every mutant on every
    case of its op, in the first units, and nothing is judged during the run.
    `judge(case, backend) -> bool | None` says whether the mutant's record caught it (None: it
    could not tell, and the mutant goes on)."""

    def __init__(self, cases, specs, mutants: list[Mutant], judge, all_cases: bool = False):
        self.mutants, self.judge, self.all_cases = list(mutants), judge, all_cases
        self.spec_of = {s.implementation: s for s in specs if s.kind == "mutant"}
        self.order = {m.name: case_order(m, cases) for m in self.mutants}
        self.step = dict.fromkeys(self.order, 0)  # index in order of the case a mutant is on
        self.tried: dict[str, list[str]] = {m.name: [] for m in self.mutants}  # case ids, in order
        self.caught_at: dict[str, str] = {}
        self.queued: dict[str, list] = {}  # case id -> the spec list of its queued unit (still mutable)
        self.ended: set[str] = set()  # case ids whose first unit ended (FLA's record is written)
        self.held: dict[str, list] = defaultdict(list)  # case id -> mutant specs waiting for its first unit
        super().__init__(cases, specs)

    def initial_units(self):
        always = [s for s in self.specs if s.kind != "mutant"]
        first: dict[str, list] = defaultdict(list)
        for m in self.mutants:
            runs_on = self.order[m.name] if self.all_cases else self.order[m.name][:1]
            for c in runs_on:
                first[c.id].append(self.spec_of[m.name])
                self.tried[m.name].append(c.id)
        units = [(c, always + first[c.id]) for c in self.cases]
        # cases that start mutants first (their chains start early), then the costliest first
        units.sort(key=lambda u: (not first[u[0].id], tuple(-x for x in cost(u[0]))))
        return units

    def plan(self, case, specs, first=False):
        super().plan(case, specs, first)
        self.queued[case.id] = self.queue[0 if first else -1][1]

    def take(self):
        unit = super().take()
        if unit is not None and self.queued.get(unit[0].id) is unit[1]:
            del self.queued[unit[0].id]
        return unit

    def pending(self) -> bool:
        return super().pending() or any(self.held.values())

    def finished(self, case, specs) -> None:
        for spec in specs:
            if spec.kind == "mutant" and not self.all_cases:
                self._judged(spec, case)
        if case.id not in self.ended:
            self.ended.add(case.id)
            waiting = self.held.pop(case.id, [])
            if waiting:
                self.plan(case, waiting, first=True)

    def _judged(self, spec, case) -> None:
        name = spec.implementation
        if self.judge(case, spec.name):
            self.caught_at[name] = case.id
            return
        self.step[name] += 1
        if self.step[name] >= len(self.order[name]):
            return  # every case of its op ran: not caught
        nxt = self.order[name][self.step[name]]
        self.tried[name].append(nxt.id)
        if nxt.id in self.queued:  # join its queued unit, which runs next
            unit = next(u for u in self.queue if u[1] is self.queued[nxt.id])
            unit[1].append(spec)
            self.note(nxt, [spec])
            self.queue.remove(unit)
            self.queue.appendleft(unit)
        elif nxt.id not in self.ended:  # its first unit is running
            self.held[nxt.id].append(spec)
            self.note(nxt, [spec])
        else:
            self.plan(nxt, [spec], first=True)


def judge_record(out: Path, factor: float, run_id: str):
    """judge(case, backend) for MutantSchedule: whether the gate fails `backend`'s record of
    `case` in `out` (written by run `run_id`), against FLA's record and with its TPU compile
    record; None when a record is missing, unreadable or of another run."""

    def read(path: Path, check) -> dict | None:
        try:
            rec = read_checked(path)
            check(rec, path)
        except RecordError:
            return None
        return rec if rec.get("run_id") == run_id else None

    def judge(case, backend: str) -> bool | None:
        ref = read(result_path(out, REFERENCE, case.id), check_result)
        rec = read(result_path(out, backend, case.id), check_result)
        if ref is None or rec is None:
            return None
        comp = result_path(out, backend, case.id, kind="compile")
        compiles = {}
        if comp.exists():
            crec = read(comp, check_compile)
            if crec is None:
                return None
            compiles = {backend: crec}
        judged = judge_case(case.id, {REFERENCE: ref, backend: rec}, compiles, factor)
        if judged.refused:
            return None
        entry = judged.entry(backend)
        return entry is not None and _caught(entry)

    return judge


def score(gate: dict, mutants: list[Mutant], schedule: MutantSchedule | None = None) -> dict:
    """Per mutant: the cases and checks that caught it, the cases it ran (supported ones: a
    kernel that has no kernel for a case did not run it) and, from the schedule, the cases it
    was tried on in order and whether it stopped at its first catch; the unmutated kernels'
    failures."""
    rows = []
    for m in mutants:
        caught, ran = [], 0
        for entry in gate["cases"]:
            if entry["candidate"] != f"mutant-{m.name}" or entry["verdict"] == "unsupported":
                continue
            ran += 1
            if _caught(entry):
                checks = sorted(
                    {t["verdict"] for t in entry["tensors"].values() if t["verdict"] not in NOT_A_CATCH}
                    or {entry["verdict"]}
                )
                tensors = sorted(n for n, t in entry["tensors"].items() if t["verdict"] not in NOT_A_CATCH)
                where = {n: describe_localisation(entry["tensors"][n].get("localisation")) for n in tensors}
                caught.append(
                    {
                        "case_id": entry["case_id"],
                        "checks": checks,
                        "tensors": tensors,
                        "where": {n: w for n, w in where.items() if w},
                    }
                )
        row = {
            "mutant": m.name,
            "seed": m.seed,
            "what": m.what,
            "cases_run": ran,
            "caught": bool(caught),
            "caught_by": caught,
        }
        if schedule is not None:
            tried = schedule.tried[m.name]
            if not schedule.all_cases:  # the gate's entries in the order the mutant ran them
                order = {c: i for i, c in enumerate(tried)}
                row["caught_by"].sort(key=lambda cb: order.get(cb["case_id"], len(order)))
            row.update(
                stops_at_first_catch=not schedule.all_cases,
                cases_of_op=len(schedule.order[m.name]),
                cases_tried=tried,
            )
        rows.append(row)
    clean = [f for f in gate["failures"] if not f["candidate"].startswith("mutant-")]
    n_caught = sum(r["caught"] for r in rows)
    return {
        "mutants": rows,
        "caught": n_caught,
        "total": len(rows),
        "score": n_caught / len(rows) if rows else None,
        "unmutated_failures": clean,
    }


def format_score(result: dict) -> str:
    stops = any(r.get("stops_at_first_catch") for r in result["mutants"])
    lines = []
    if stops:
        lines.append("each mutant stopped at the first case that caught it (--all-cases: every case of its op)")
    lines.append(f"{'mutant':30s} {'seed':5s} {'cases':>7s}  caught by")
    for r in result["mutants"]:
        if r["caught"]:
            checks = sorted({c for cb in r["caught_by"] for c in cb["checks"]})
            first = r["caught_by"][0]
            detail = f"({', '.join(first['tensors']) or first['checks'][0]})"
            if stops:
                by = f"{first['case_id']} [{', '.join(first['checks'])}] {detail}"
            else:
                by = f"{len(r['caught_by'])} case(s) [{', '.join(checks)}], e.g. {first['case_id']} {detail}"
            if first.get("where"):
                name, where = next(iter(first["where"].items()))
                by += f"\n{'':45s}at {name}: {where}"
        else:
            why = (
                ""
                if r["cases_run"]
                else f" (its kernel supports none of its op's {r['cases_of_op']} cases)"
                if r.get("cases_of_op")
                else " (no case of its op selected)"
            )
            by = "NOT CAUGHT" + why
        n = f"{r['cases_run']}/{r['cases_of_op']}" if "cases_of_op" in r else str(r["cases_run"])
        lines.append(f"{r['mutant']:30s} {r['seed'] or '-':5s} {n:>7s}  {by}")
    lines.append(
        f"score: {result['caught']}/{result['total']} mutants caught"
        + (f" ({100 * result['score']:.0f}%)" if result["score"] is not None else "")
    )
    clean = result["unmutated_failures"]
    lines.append(
        "unmutated kernels: clean"
        if not clean
        else f"unmutated kernels: {len(clean)} failures, e.g. {clean[0]['case_id']} [{clean[0]['candidate']}] "
        f"{clean[0]['tensor'] or ''} {clean[0]['verdict']}"
    )
    return "\n".join(lines)


def run_mutants(
    cases: list[Case],
    out: Path,
    jobs: int = 1,
    timeout_s: float = 900.0,
    factor: float = 1.0,
    names: list[str] | None = None,
    progress: bool = True,
    tpu_targets: tuple[str, ...] = (),
    all_cases: bool = False,
) -> dict:
    """Run the unmutated kernels and FLA over `cases` and the mutants as MutantSchedule plans
    (each stops at its first catch; `all_cases`: every case of its op), compiling the jax
    candidates for `tpu_targets`; gate this run's records (held to its manifest: GateRefusal on
    a missing one) and score them. The result has "interrupted" set, and no score, when a
    signal ended the run."""
    mutants = [BY_NAME[n] for n in names] if names else [m for m in CATALOGUE if not m.narrow]
    specs = [REFERENCE, "pallas", "pallas-fused"] + [f"{MUTANT_PREFIX}{m.name}" for m in mutants]
    run_id = uuid.uuid4().hex[:12]
    plans: list[MutantSchedule] = []

    def schedule(cs, sp):
        plans.append(MutantSchedule(cs, sp, mutants, judge_record(out, factor, run_id), all_cases))
        return plans[-1]

    cfg = RunConfig(
        out_dir=out,
        backends=specs,
        jobs=jobs,
        timeout_s=timeout_s,
        progress=progress,
        tpu_targets=tpu_targets,
        run_id=run_id,
    )
    summary = run_cases(cases, cfg, schedule)
    if summary["interrupted"]:
        return {"interrupted": summary["interrupted"], "run_id": run_id}
    by_case, compiles, _ = load_checked([out])
    mine = lambda d: {c: {b: r for b, r in rs.items() if r["run_id"] == run_id} for c, rs in d.items()}
    by_case = {c: rs for c, rs in mine(by_case).items() if rs}
    gate = evaluate(by_case, factor, compiles={c: rs for c, rs in mine(compiles).items() if rs})
    result = score(gate, mutants, plans[0])
    write_json(
        out / "mutants.json",
        {
            **result,
            "run_id": run_id,
            "bound_factor": factor,
            "stops_at_first_catch": not all_cases,
            "cases": [c.id for c in cases],
            "units": summary["units"],
            "wall_time_s": summary["wall_time_s"],
        },
    )
    write_json(out / "gate.json", gate)
    return result
