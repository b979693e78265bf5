"""The units of `parity mutants` (MutantSchedule): each mutant tries its op's cases one after
another (parity.mutants.order) and stops at the first that catches it."""

from __future__ import annotations

from collections import defaultdict

from parity.execute.runner import Schedule
from parity.mutants import Mutant
from parity.mutants.order import case_order, cost


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
        if self.join(nxt, [spec]):  # its queued unit takes the mutant and runs next
            return
        if nxt.id not in self.ended:  # its first unit is running
            self.held[nxt.id].append(spec)
            self.note(nxt, [spec])
        else:
            self.plan(nxt, [spec], first=True)
