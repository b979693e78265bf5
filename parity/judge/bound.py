"""The bound: a candidate's tensor against the reference's, the rule of the gate above each
tensor's own tolerance (docs/bound.md).

`bound(cand, ref, factor)` judges two compare_tensor records: the compute error over the seeds
both hold (parity.measure.compare.compute_judgement, parity.measure.compute_error), and
max_abs <= factor * (1 + MAX_ABS_MARGIN) * max_abs_r + floor_abs on the case's own seed. It names
the rule that decided (BOUND_RULES); parity.judge.words.describe_bound gives that rule with its
figures.
"""

from __future__ import annotations

from parity.measure.compare import compute_judgement, finite_seed, seed_figures
from parity.measure.compute_error import MAX_ABS_MARGIN, SEEDS_MAX, SEEDS_MIN
from parity.model.verdict import Verdict

# The rules of the bound, by the name `bound` records in "rule": the one that decided its verdict
# (for a failure, the first that failed in this order; describe_bound gives its figures).
BOUND_RULES = {
    "nan-inf": "the candidate has NaN/Inf where the oracle is finite",
    "ratio-interval": "the compute error's ratio to the reference's, with its interval over the seeds",
    "rounding-eps-limit": "the reference at the rounding level: eps <= factor x eps_reference + floor",
    "rounding-compute-limit": "the reference at the rounding level: compute error <= factor x the reference's bound",
    "rounding": "the reference at the rounding level: both of its limits",
    "no-common-seed": "no seed with figures in both records",
    "max-abs": "max_abs <= factor x (1 + MAX_ABS_MARGIN) x the reference's + floor_abs",
    "reference-nonfinite": "the reference has NaN/Inf: nothing bounds the candidate",
}


def bound(cand: dict, ref: dict, factor: float = 1.0, seeds_min: int = SEEDS_MIN, seeds_max: int = SEEDS_MAX) -> dict:
    """The bound for two compare_tensor records (with their seeds, parity.execute.case): the compute
    error's, judged over the seeds both hold (compute_judgement with this seed policy: fewer seeds
    than it needs is `inconclusive`), and max_abs <= factor * (1 + MAX_ABS_MARGIN) * max_abs_r +
    floor_abs on the case's own seed. verdict: pass | fail-bound | inconclusive; ok: verdict == pass."""
    out = {"factor": factor}
    cand_seeds = {s["seed"] for s in seed_figures(cand)}
    shared = [s for s in seed_figures(ref) if s["seed"] in cand_seeds]
    nonfinite_seeds = [s["seed"] for s in shared if not finite_seed(s)]
    # its epsilons cover only its finite elements: no bound from a seed where it is NaN or Inf, and
    # none at all where it is on every seed both ran (or, for a record without seeds, on its own)
    own_nonfinite = bool(ref.get("nan") or ref.get("inf"))  # on the case's own seed (max_abs's)
    ref_nonfinite = own_nonfinite if not shared else len(nonfinite_seeds) == len(shared)
    if ref_nonfinite:
        out["reference_nonfinite"] = True
    elif nonfinite_seeds:
        out["reference_nonfinite_seeds"] = nonfinite_seeds  # left out of the bound
    cand_nonfinite = bool(cand.get("nan") or cand.get("inf")) or cand.get("rel_rms") is None
    verdict = Verdict.FAIL_BOUND if cand_nonfinite else Verdict.PASS
    out["rule"] = "nan-inf" if cand_nonfinite else "reference-nonfinite" if ref_nonfinite else "max-abs"
    if cand_nonfinite:
        out["nonfinite"] = {"nan": cand.get("nan") or 0, "inf": cand.get("inf") or 0}
    out["rel_rms"] = {"candidate": cand.get("rel_rms"), "reference": ref.get("rel_rms"), "limit": None, "ratio": None}
    if not (ref_nonfinite or cand_nonfinite or ref.get("rel_rms") is None):
        compute, verdict = _compute_bound(cand, ref, factor, seeds_min, seeds_max)
        out.update(compute)
        out["rule"] = _compute_rule(compute.get("compute"), verdict)
    out["max_abs"] = _max_abs_bound(cand, ref, factor, own_nonfinite)
    c, limit = out["max_abs"]["candidate"], out["max_abs"]["limit"]
    if c is None or (limit is not None and not c <= limit):
        out["rule"] = out["rule"] if verdict == Verdict.FAIL_BOUND else "max-abs"
        verdict = Verdict.FAIL_BOUND
    out["verdict"] = verdict
    out["ok"] = verdict == Verdict.PASS
    return out


def _compute_rule(j: dict | None, verdict: Verdict) -> str:
    """The BOUND_RULES name of the compute-error judgement `j` that gave `verdict`."""
    if j is None:
        return "no-common-seed"
    if j["method"] == "ratio":
        return "ratio-interval"
    if verdict == Verdict.FAIL_BOUND:  # compute_error.judge: the eps limit with its zone, else the compute limit
        zone = j["indifference"] / j["factor"] if j["factor"] > 0 else 1.0
        return "rounding-eps-limit" if j["eps_candidate"] > j["limit"] * zone else "rounding-compute-limit"
    return "rounding"


# the bound's verdict from compute_error.verdict_after's state (more seeds wanted: inconclusive)
_VERDICT_OF_STATE = {"pass": Verdict.PASS, "fail": Verdict.FAIL_BOUND}


def _compute_bound(cand: dict, ref: dict, factor: float, seeds_min: int, seeds_max: int) -> tuple[dict, Verdict]:
    """The compute error judged over the seeds both records hold: ({"compute", "rel_rms" (the judged
    figures: c_ or eps_ candidate and reference, limit, ratio), "note" (when undecided)}, verdict)."""
    j = compute_judgement(cand, ref, factor, seeds_min, seeds_max)
    if j is None:
        return {"compute": None, "note": "no seed with figures in both records"}, Verdict.INCONCLUSIVE
    out: dict = {"compute": j}
    if j["method"] == "ratio":
        out["rel_rms"] = {
            "candidate": j["c_candidate"],
            "reference": j["c_reference"],
            "limit": factor * j["c_reference"],
            "ratio": j["ratio"],
        }
    else:
        out["rel_rms"] = {
            "candidate": j["eps_candidate"],
            "reference": j["eps_reference"],
            "limit": j["limit"],
            "ratio": j["eps_candidate"] / j["eps_reference"] if j["eps_reference"] > 0 else None,
        }
    if j["state"] == "more":
        out["note"] = (
            f"{j['seeds']} seed(s) in both records leave it undecided; the seed policy asks for "
            f"{seeds_min} to {seeds_max}"
        )
    return out, _VERDICT_OF_STATE.get(j["state"], Verdict.INCONCLUSIVE)


def _max_abs_bound(cand: dict, ref: dict, factor: float, own_nonfinite: bool) -> dict:
    """{"candidate", "reference", "limit", "ratio"} of max_abs on the case's own seed; limit
    factor * (1 + MAX_ABS_MARGIN) * max_abs_r + floor_abs, None where either max_abs is missing or
    the reference is NaN/Inf there."""
    c, r = cand.get("max_abs"), ref.get("max_abs")
    if c is None or r is None or own_nonfinite:
        return {"candidate": c, "reference": r, "limit": None, "ratio": None}
    return {
        "candidate": c,
        "reference": r,
        "floor": ref["floor_abs"],
        "limit": factor * (1 + MAX_ABS_MARGIN) * r + ref["floor_abs"],
        "ratio": c / r if r > 0 else (0.0 if c == 0 else None),
    }
