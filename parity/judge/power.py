"""`parity power DIR`: the gate's power against controlled degradations.

For every case whose reference (FLA) record is in DIR (with every seed a verdict may use: up to 64
for a case with a tensor of one block per seed; benchmarks/power_ci.py runs each case of a suite on
its own count), a ladder of synthetic candidates: on every tensor,
the exact result (the cached float64 oracle of each seed) plus Gaussian noise of rms r x the
reference's compute error on that seed (parity.measure.compute_error.noisy), added before the
rounding to the output dtype, for r in LEVELS and `reps` independent draws each. Each candidate
grows seed by seed exactly as `parity run` grows one (parity.execute.case.wants_seed) and is
judged by the gate itself (parity.judge.gate.evaluate) against the reference's real record; no
kernel runs again. Per op x dtype x gate x tensor (the gate decides where a [B, T, H] tensor's
magnitude sits, and so its power) it reports the share of draws the gate did not pass (caught:
fail-bound or inconclusive) at each r, r_95 (the smallest r from which on >= 95% are caught) and
the false alarms at r = 0.9 and 1.0. Targets: r_95 <= 1.25, false alarms <= 1%. A (case, tensor)
whose reference is NaN or Inf has no bound in the gate (the tolerance only): it is listed apart
(no_bound), not counted in its row.
"""

from __future__ import annotations

import copy
import hashlib
from collections import defaultdict
from pathlib import Path

import numpy as np

from cases import Case
from parity.execute.backends.oracle import cached_oracle
from parity.execute.case import wants_seed
from parity.judge.gate import evaluate
from parity.judge.load import load_checked
from parity.measure.compare import compare_tensor, error_blocks
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN, compute_error, noisy
from parity.measure.tol import NP_DTYPES
from parity.model.inputs import case_inputs
from parity.model.spec import REFERENCE
from parity.model.verdict import Verdict
from references import error_scales

LEVELS = (0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)
REPS = 20
CAUGHT_FOR_POWER = 0.95


def _oracles(case: Case, seeds: list[int]) -> list[tuple[dict, dict]]:
    """(oracle tensors, error scales) of each input seed of the case (the disk cache)."""
    out = []
    for s in seeds:
        c = case.replace(seed=s)
        full = cached_oracle(c, case_inputs(c))[0]
        out.append((full, error_scales(full)))
    return out


def _candidate(case: Case, ref: dict, oracles: list, level: float, rep: int, seeds_policy) -> dict:
    """The synthetic candidate record at `level` x the reference's compute error, draw `rep`, grown
    seed by seed while wants_seed asks (it never has more seeds than the reference)."""
    cand = copy.deepcopy(ref)
    cand.update(
        backend="noise",
        side="candidate",
        verdict=Verdict.PASS,  # until its own tensors say otherwise (the reference's may be a finding)
        platform="synthetic: oracle + noise",
        seed_policy={"min": seeds_policy[0], "max": seeds_policy[1]},
    )
    names = [n for n, t in ref["tensors"].items() if t.get("verdict") != Verdict.UNSUPPORTED and "seeds" in t]
    for k, (full, scales) in enumerate(oracles):
        if k and not wants_seed([ref, cand], k, *seeds_policy):
            break
        for n in names:
            r = full[n]
            t_ref = ref["tensors"][n]
            dt = NP_DTYPES[t_ref["dtype"]]
            key = hashlib.sha256(f"power/{case.id}/{level}/{rep}/{k}/{n}".encode()).digest()[:8]
            c_ref = compute_error(t_ref["seeds"][k : k + 1]) or 0.0  # the reference's on this seed
            x = noisy(r, level * c_ref, dt, np.random.default_rng(int.from_bytes(key, "little")), scales.get(n))
            entry = {"seed": t_ref["seeds"][k]["seed"], "input_hash": t_ref["seeds"][k]["input_hash"]}
            if k == 0:
                t = compare_tensor(case, n, x, r, scales.get(n))
                entry.update(t.pop("blocks"))
                t["seeds"] = [entry]
                cand["tensors"][n] = t
                if t["verdict"] != Verdict.PASS:
                    cand["verdict"] = Verdict.FAIL_ACCURACY
            else:
                rounded = np.asarray(r, np.float64).astype(dt).astype(np.float64)
                entry.update(error_blocks(case, n, x, r, rounded, scales.get(n)))
                cand["tensors"][n]["seeds"].append(entry)
        cand["seeds"] = ref["seeds"][: k + 1]
    return cand


def ladder(
    dirs: list[Path],
    levels=LEVELS,
    reps: int = REPS,
    factor: float = 1.0,
    seeds_policy: tuple[int, int] = (SEEDS_MIN, SEEDS_MAX),
    progress=lambda msg: None,
) -> dict:
    """The power table of the references in `dirs` (module docstring)."""
    by_case, _, _ = load_checked(dirs)
    caught: dict[tuple, dict[float, list[int]]] = defaultdict(lambda: defaultdict(list))
    seeds_used: dict[tuple, list[int]] = defaultdict(list)
    methods: dict[tuple, set] = defaultdict(set)
    skipped, seeds_short, no_bound = [], False, set()
    for case_id in sorted(by_case):
        ref = by_case[case_id].get(REFERENCE)
        if ref is None or ref["status"] != "ok":
            skipped.append(case_id)
            continue
        case = Case.from_dict(ref["case"])
        oracles = _oracles(case, [s["seed"] for s in ref["seeds"]][: seeds_policy[1]])
        policy = (min(seeds_policy[0], len(oracles)), len(oracles))  # no more seeds than the reference has
        progress(f"{case_id}: {len(oracles)} seeds")
        seeds_short = seeds_short or len(oracles) < seeds_policy[1]
        for level in levels:
            for rep in range(reps):
                cand = _candidate(case, ref, oracles, level, rep, policy)
                entry = evaluate({case_id: {REFERENCE: ref, "noise": cand}}, factor)["cases"][0]
                for n, t in entry["tensors"].items():
                    if t["verdict"] == Verdict.UNSUPPORTED:
                        continue
                    if (t.get("bound") or {}).get("reference_nonfinite"):  # the gate holds it to no bound
                        no_bound.add(f"{case_id}/{n}")
                        continue
                    row = (case.op, case.dtype, case.gate, n)  # the gate decides where a tensor's magnitude sits
                    caught[row][level].append(int(t["verdict"] != Verdict.PASS))
                    j = (t.get("bound") or {}).get("compute") or {}
                    seeds_used[row].append(j.get("seeds", 0))
                    methods[row].add(j.get("method"))
    rows = []
    for row in sorted(caught):
        share = {lv: float(np.mean(v)) for lv, v in sorted(caught[row].items())}
        r95 = None
        for lv in sorted(share, reverse=True):
            if share[lv] < CAUGHT_FOR_POWER:
                break
            r95 = lv
        rows.append(
            {
                "op": row[0],
                "dtype": row[1],
                "gate": row[2],
                "tensor": row[3],
                "trials_per_level": len(caught[row][levels[0]]),
                "caught": share,
                "r_95": r95,
                "false_alarm_0.9": share.get(0.9),
                "false_alarm_1.0": share.get(1.0),
                "mean_seeds": float(np.mean(seeds_used[row])),
                "methods": sorted(m for m in methods[row] if m),
            }
        )
    return {
        "kind": "power",
        "levels": list(levels),
        "reps": reps,
        "factor": factor,
        "seeds_policy": list(seeds_policy),
        "cases": len(by_case) - len(skipped),
        "skipped": skipped,
        "seeds_short": seeds_short,  # some reference had fewer seeds than seeds_max: the ladder stopped there
        # (case, tensor) whose reference is NaN or Inf: the gate enforces no bound there (tolerance only), so
        # no power to measure; listed, not folded into their row
        "no_bound": sorted(no_bound),
        "rows": rows,
        # rows where even the top level was caught in fewer than 95% of draws: r_95 is above the ladder
        "not_caught": [f"{r['op']}/{r['dtype']}/{r['gate']}/{r['tensor']}" for r in rows if r["r_95"] is None],
        "worst_r_95": max(r["r_95"] for r in rows) if rows and all(r["r_95"] is not None for r in rows) else None,
        "max_false_alarm": max((max(r["false_alarm_0.9"] or 0, r["false_alarm_1.0"] or 0) for r in rows), default=None),
    }


def format_table(result: dict) -> str:
    """The power table as Markdown: op, dtype, gate, tensor, r_95, false alarms at 0.9 and 1.0, caught per r."""
    levels = result["levels"]
    head = "| op | dtype | gate | tensor | trials | r_95 | false alarms r=0.9 | r=1.0 | mean seeds | " + " | ".join(
        f"caught r={lv:g}" for lv in levels
    )
    lines = [head + " |", "|" + " --- |" * (9 + len(levels))]
    pct = lambda v: "n/a" if v is None else f"{100 * v:.0f}%"
    for r in result["rows"]:
        r95 = f"> {levels[-1]:g}" if r["r_95"] is None else f"{r['r_95']:g}"
        method = " (rounding)" if r["methods"] == ["rounding"] else ""
        lines.append(
            f"| {r['op']} | {r['dtype']} | {r['gate']} | {r['tensor']}{method} | "
            f"{r['trials_per_level']} | {r95} | "
            f"{pct(r['false_alarm_0.9'])} | {pct(r['false_alarm_1.0'])} | {r['mean_seeds']:.1f} | "
            + " | ".join(pct(r["caught"].get(lv)) for lv in levels)
            + " |"
        )
    if result.get("no_bound"):
        lines += ["", "No bound (the reference's tensor is NaN or Inf; the gate checks the tolerance only):"]
        lines += [f"- {x}" for x in result["no_bound"]]
    return "\n".join(lines)
