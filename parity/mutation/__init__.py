"""Mutation testing: the catalogue's mutants (parity.mutants) run beside the unmutated kernels
and FLA through the gate, scored by which cases and checks caught each; `parity mutants` is its
command (parity.cli.mutants).

By default a mutant stops at the first case that catches it (`MutantSchedule`): it tries its
op's cases of the selection one after another, its witness first when the selection holds it,
then the cases most like the witness (parity.mutants.order), and goes on to its next case only
while the gate passes it. Every case runs once with the oracle, FLA and the unmutated kernels
(pallas, pallas-fused) and the mutants whose first case it is; a mutant's later cases join that
case's first unit while it waits, or run after it (inputs drawn again, the oracle from its cache,
FLA's record already written). `all_cases` runs every mutant on every case of its op instead:
the full catch matrix. The run's manifest lists exactly the (case, backend) pairs planned, so
`parity gate` on the output refuses any record a mutant was meant to write and did not.

Modules: schedule (MutantSchedule, the units), judgement (what is a catch: catches, and the
judge the schedule asks: judge_record), score (score, format_score); here the run (run_mutants).
Outputs under OUT: the run's records and manifest, mutants.json (the score, the run's id, cases
and units) and gate.json (the gate over this run's records).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from cases import Case
from parity.execute.runner import RunConfig, run_cases
from parity.judge.gate import evaluate, load_checked
from parity.model.spec import MUTANT_PREFIX, REFERENCE
from parity.mutants import BY_NAME, CATALOGUE
from parity.mutation.judgement import catches, judge_record
from parity.mutation.schedule import MutantSchedule
from parity.mutation.score import format_score, score
from parity.records import write_json


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


__all__ = [
    "MutantSchedule",
    "catches",
    "format_score",
    "judge_record",
    "run_mutants",
    "score",
]
