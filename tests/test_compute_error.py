"""Compute error apart from output rounding, and the bound on it judged over seeds
(parity.measure.compute_error): the statistic, the gate's verdicts, the seed loop."""

import ml_dtypes
import numpy as np
import pytest

from cases import Case, make_inputs, seed_at
from parity.execute.backends.oracle import cached_oracle
from parity.judge.gate import evaluate, format_summary
from parity.measure.compare import compare_tensor
from parity.measure.compute_error import compute_error, judge, noisy, verdict_after
from parity.model.spec import SpecError, parse_backend_spec
from parity.records import RecordError, check_result

from .helpers import deep, noise_run

# ci-sized bfloat16 (o, dq, dk, dv in bf16; ht, dg, dh0 in float32)
CASE = Case.from_id("simple_gla-fwdbwd-B1-T64-H2-K64-V64-bf16-C64-g_logsig-h0-ht")
FLA = 1.75e-3  # FLA's compute error on such bf16 tensors (measured: 1.7-1.8e-3)
BF16 = ("o", "dq", "dk", "dv")


@pytest.fixture(scope="module")
def oracle():
    return cached_oracle(CASE, make_inputs(CASE))[0]


def _gate(recs: dict, **kw) -> dict:
    return evaluate({CASE.id: recs}, **kw)


@pytest.mark.parametrize("rel", [1e-3, 1.75e-3, 4e-3])
def test_compute_error_recovers_the_noise_rms_added_before_bf16_rounding(oracle, rel):
    """exact + Gaussian noise of rms rel, then bf16 rounding: sqrt(eps^2 - floor^2) is rel within
    a few percent, where eps itself is rel and the rounding together (at 1e-3, 1.9x rel)."""
    rng = np.random.default_rng(7)
    for name in BF16:
        t = compare_tensor(CASE, name, noisy(oracle[name], rel, ml_dtypes.bfloat16, rng), oracle[name])
        c = compute_error([t["blocks"]])
        assert c == pytest.approx(rel, rel=0.06), name
        assert t["rel_rms"] == pytest.approx(np.hypot(rel, t["floor_rel"]), rel=0.03)
    rounded = compare_tensor(CASE, "o", oracle["o"].astype(ml_dtypes.bfloat16), oracle["o"])
    assert compute_error([rounded["blocks"]]) == 0.0  # the exact result rounded: no compute error


def test_a_candidate_1_7x_worse_in_bf16_fails_where_the_floor_let_it_pass(tmp_path):
    """The floor-doubled allowance alone (eps_c <= eps_r + floor) passes 1.7x; the compute-error
    bound fails it, and 1.25x, on every bf16 tensor, with an interval above 1."""
    for times in (1.7, 1.25):
        recs = noise_run(CASE, tmp_path / str(times), FLA, times * FLA)
        r = _gate(recs)
        assert not r["ok"]
        bad = {f["tensor"]: f for f in r["failures"]}
        assert set(bad) == set(BF16) and {f["verdict"] for f in bad.values()} == {"fail-bound"}
        for f in bad.values():
            assert f["interval"][0] > 1.0 and f["ratio"] == pytest.approx(times, rel=0.1)
        if times == 1.7:  # the floor-doubled allowance alone passes it
            t, rt = recs["cand"]["tensors"]["o"], recs["fla"]["tensors"]["o"]
            assert t["rel_rms"] <= rt["rel_rms"] + rt["floor_rel"]
        assert "over" in format_summary(r)


@pytest.mark.parametrize("times", [1.0, 0.9])
def test_a_tie_and_a_better_candidate_pass_on_every_seed(tmp_path, times):
    """No false alarm: a candidate as accurate as the reference (independent noise of the same
    rms) passes on 10 case seeds, its verdicts resting on at least 3 input seeds; 0.9x passes."""
    for s in range(10):
        c = CASE.replace(seed=s)
        recs = noise_run(c, tmp_path / f"{times}-{s}", FLA, times * FLA)
        r = evaluate({c.id: recs})
        assert r["ok"], format_summary(r)
        j = r["cases"][0]["tensors"]["o"]["bound"]["compute"]
        assert j["method"] == "ratio" and j["seed_list"][0] == s
        if times == 1.0:  # close to the bound: at least the minimum of seeds, derived from the case's own
            assert j["seeds"] >= 3 and j["seed_list"][1] == seed_at(s, 1)


def test_seeds_stop_early_far_from_the_bound(tmp_path):
    """A candidate far better (0.3x) or far worse (3x) is decided on the case's own seed; its
    float32 tensors (exact on both sides) are judged by the rounding bound."""
    for times, ok in ((0.3, True), (3.0, False)):
        recs = noise_run(CASE, tmp_path / str(times), FLA, times * FLA)
        assert [s["seed"] for s in recs["cand"]["seeds"]] == [CASE.seed]
        r = _gate(recs)
        assert r["ok"] is ok
        assert r["cases"][0]["tensors"]["ht"]["bound"]["compute"]["method"] == "rounding"


def test_a_missing_seed_does_not_pass(tmp_path):
    """At a tie the verdict needs 3 seeds: a candidate record that lost a seed's figures, or all of
    them, is inconclusive (a failure); one whose seed's inputs differ is refused."""
    from parity.judge.gate import GateRefusal

    recs = noise_run(CASE, tmp_path, FLA, FLA)
    assert _gate(recs)["ok"] and len(recs["cand"]["seeds"]) >= 3
    short = deep(recs)
    for t in short["cand"]["tensors"].values():
        t["seeds"] = t["seeds"][:1]
    r = _gate(short)
    assert not r["ok"] and {f["verdict"] for f in r["failures"]} == {"inconclusive"}
    none = deep(recs)
    del none["cand"]["tensors"]["dq"]["seeds"]
    r = _gate(none)
    assert not r["ok"] and [(f["tensor"], f["verdict"]) for f in r["failures"]] == [("dq", "inconclusive")]
    other = deep(recs)
    other["cand"]["tensors"]["o"]["seeds"][1]["input_hash"] = "0" * 64
    with pytest.raises(GateRefusal, match="input hash differs"):
        _gate(other)


def _undecided(recs: dict) -> dict:
    """recs with o's blocks replaced by a candidate 1.1x the reference with a wide spread, and a
    seed policy that allows no more seeds: undecided at the limit."""
    out = deep(recs)
    rng = np.random.default_rng(0)
    for rec, a in ((out["fla"], np.full(8, 1.0)), (out["cand"], 1.21 * (1 + 0.5 * rng.standard_normal(8)))):
        rec["seed_policy"] = {"min": 1, "max": 1}
        t = rec["tensors"]["o"]
        t["seeds"] = t["seeds"][:1]
        t["seeds"][0]["floor2"] = [1.0] * 8
        t["seeds"][0]["err2"] = list(1.0 + a)
    return out


def test_inconclusive_fails_unless_allowed(tmp_path):
    recs = _undecided(noise_run(CASE, tmp_path, FLA, FLA, seeds=(1, 1)))
    j = _gate(recs)["cases"][0]["tensors"]["o"]["bound"]["compute"]
    assert j["decision"] == "undecided" and j["lo"] <= 1.0 < 1.25 < j["hi"]
    strict = _gate(recs)
    assert not strict["ok"] and [(f["tensor"], f["verdict"]) for f in strict["failures"]] == [("o", "inconclusive")]
    allowed = _gate(recs, allow_inconclusive=True)
    assert allowed["ok"] and [f["tensor"] for f in allowed["inconclusive"]] == ["o"]
    assert "INCONCLUSIVE (allowed)" in format_summary(allowed)


def test_judge_rules():
    """fail when the interval is above the factor, pass when at or below factor x 1.25, more seeds
    before the minimum unless far, inconclusive at the maximum; a reference without resolvable
    compute error falls back to the rounding bound."""
    rng = np.random.default_rng(1)
    d = 1 + 0.05 * rng.standard_normal(24)
    seeds = lambda a: [{"err2": list(1 + a[i : i + 8]), "floor2": [1.0] * 8} for i in range(0, len(a), 8)]
    assert judge(seeds(1.6 * d), seeds(d))["decision"] == "fail"
    tie = judge(seeds(d * (1 + 0.05 * rng.standard_normal(24))), seeds(d))
    assert tie["decision"] == "pass" and verdict_after(tie) == "pass"
    one = judge(seeds(d[:8] * 1.02), seeds(d[:8]))
    assert verdict_after(one) == "more"
    assert verdict_after({**one, "seeds": 8, "blocks": 64, "decision": "undecided"}) == "inconclusive"
    assert verdict_after(judge(seeds(d[:8] * 9), seeds(d[:8]))) == "fail"  # far: one seed decides
    flat = judge(seeds(np.zeros(8)), seeds(np.zeros(8)))
    assert flat["method"] == "rounding" and flat["decision"] == "pass"


def test_a_tensor_with_few_blocks_per_seed_goes_on_past_eight_seeds_looking_at_the_stated_seeds():
    """Undecided, a tensor of 2 blocks per seed (a [B, T, H] tensor at B = 1, H = 2) goes on past
    SEEDS_BASE until it has BLOCKS_ENOUGH blocks, is looked at only at LOOKS, and is inconclusive at
    the policy's maximum; a tensor of 8 blocks per seed is inconclusive at SEEDS_BASE.
    Under the rounding rule the zone above the limit is undecided until the end, where it passes."""
    from parity.measure.compute_error import BLOCKS_ENOUGH, LOOKS, SEEDS_BASE

    undecided = {"method": "ratio", "decision": "undecided", "far": None}
    at = lambda k, per_seed, **kw: verdict_after({**undecided, "seeds": k, "blocks": k * per_seed, **kw})
    assert at(SEEDS_BASE, 8) == "inconclusive"
    assert at(SEEDS_BASE, 2) == "more" and at(BLOCKS_ENOUGH // 2, 2) == "inconclusive"
    assert at(SEEDS_BASE, 1) == "more" and at(BLOCKS_ENOUGH, 1) == "inconclusive"
    assert at(10, 1) == "more"
    # a decision between looks waits for the next look; at a look it counts
    assert at(10, 1, decision="fail") == "more" and at(LOOKS[0], 1, decision="fail") == "fail"
    # the user's maximum ends it wherever it falls
    assert verdict_after({**undecided, "seeds": 10, "blocks": 10}, 3, 10) == "inconclusive"
    # a tensor decided early stops at once (no extra seeds for what is far from the bound)
    assert at(3, 1, decision="pass") == "pass"
    rounding = {"method": "rounding", "decision": "undecided", "far": None}
    assert verdict_after({**rounding, "seeds": 3, "blocks": 6}) == "more"
    assert verdict_after({**rounding, "seeds": BLOCKS_ENOUGH // 2, "blocks": BLOCKS_ENOUGH}) == "pass"
    # judge: under the rounding rule the zone between the limit and limit x 1.25 is undecided (one
    # block: no sampling error to judge compute errors by, so the limit on eps alone decides)
    ref = [{"err2": [1e-6], "floor2": [1e-6]}]  # the reference's error is its rounding's alone
    limit2 = (2 * 1e-6**0.5) ** 2  # (eps_r + floor)^2
    cand = lambda r: [{"err2": [r**2 * limit2], "floor2": [1e-6]}]
    assert [judge(cand(r), ref)["decision"] for r in (0.95, 1.1, 1.3)] == ["pass", "undecided", "fail"]
    assert judge(cand(1.1), ref)["method"] == "rounding"


def test_the_rounding_rule_holds_compute_error_to_the_references_at_most():
    """Where the reference's compute error is not resolved (a few percent of the output's rounding:
    FLA's dq on gla bf16 g_stress), the rounding rule passes a candidate whose compute error is within
    the reference's upper bound and fails one measurably above it x 1.25, on the blocks (a_b = e_b -
    f_b), not on eps <= eps_r + floor, which let a candidate with twice FLA's compute error pass."""
    rng = np.random.default_rng(3)
    floor = 1.0  # per block, the rounding's share; compute errors are squared sums on top of it
    d = 0.003 + 0.004 * rng.standard_normal(16)  # the reference: 0.3% of the rounding, spread 0.4%
    seeds = lambda a: [{"err2": list(floor + a[i : i + 8]), "floor2": [floor] * 8} for i in (0, 8)]
    tie = judge(seeds(d + 0.004 * rng.standard_normal(16)), seeds(d))
    twice = judge(seeds(4 * d + 0.004 * rng.standard_normal(16)), seeds(d))  # 2x in rms: 4x squared
    far = judge(seeds(d + 0.05), seeds(d))
    assert {j["method"] for j in (tie, twice, far)} == {"rounding"}
    assert tie["decision"] == "pass" and far["decision"] == "fail"
    assert twice["decision"] != "pass"
    assert twice["eps_candidate"] <= twice["limit"]  # where eps_r + floor alone passed it
    # the reference rounds exactly (d_b = 0): any measurable compute error of the candidate is worse
    exact = seeds(np.zeros(16))
    assert judge(seeds(np.full(16, 0.01)), exact)["decision"] == "fail"
    assert judge(exact, exact)["decision"] == "pass"


def test_seed_figures_are_checked_on_read(tmp_path):
    recs = noise_run(CASE, tmp_path, FLA, 3 * FLA, seeds=(1, 1))
    check_result(recs["cand"])
    bad = deep(recs["cand"])
    bad["tensors"]["o"]["seeds"][0]["err2"] = "x"
    with pytest.raises(RecordError, match=r"tensors.o.seeds\[0\].err2"):
        check_result(bad)


def test_noise_backend_spec():
    s = parse_backend_spec("noise:2e-3")
    assert (s.name, s.side, s.kind, s.implementation) == ("noise-2e-3", "candidate", "noise", "2e-3")
    for text in ("noise:abc", "noise:-1", "noise:2"):
        with pytest.raises(SpecError, match="noise:REL"):
            parse_backend_spec(text)


def test_power_ladder_runs_synthetic_candidates_through_the_gate(tmp_path):
    """parity power on a reference's records: 1.6x its compute error is caught on every bf16
    tensor, 0.9x never; the fp32 tensors (exact on the reference too) fall to the rounding bound."""
    from parity.judge.power import format_table, ladder
    from parity.records import write_json

    from .helpers import write_records

    recs = noise_run(CASE, tmp_path, FLA, FLA, seeds=(8, 8))
    write_records(tmp_path, *recs.values())
    assert len(recs["fla"]["seeds"]) == 8
    result = ladder([tmp_path], levels=(0.9, 1.6), reps=4)
    rows = {r["tensor"]: r for r in result["rows"]}
    for name in BF16:
        assert rows[name]["caught"] == {0.9: 0.0, 1.6: 1.0} and rows[name]["r_95"] == 1.6, rows[name]
        assert rows[name]["methods"] == ["ratio"]
    assert rows["ht"]["methods"] == ["rounding"]
    assert "| simple_gla | bfloat16 | g_logsig | o |" in format_table(result)
    # the fp32 tensors, exact on both sides, are never caught at the rounding level: above the ladder
    assert not any(row.endswith(f"/{name}") for row in result["not_caught"] for name in BF16)
    assert "simple_gla/bfloat16/g_logsig/ht" in result["not_caught"] and result["worst_r_95"] is None
    below = ladder([tmp_path], levels=(0.9,), reps=2)  # nothing caught: r_95 above the ladder on every row
    assert below["worst_r_95"] is None and "simple_gla/bfloat16/g_logsig/o" in below["not_caught"]
    write_json(tmp_path / "power.json", below)  # JSON without an infinity in it
    # a reference NaN on every seed of a tensor holds the candidate to no bound there: listed, not a row
    ht = recs["fla"]["tensors"]["ht"]
    ht["nan"], ht["verdict"] = 7, "nan-inf"
    for s in ht["seeds"]:
        s["nan"] = 7
    write_records(tmp_path, *recs.values())
    nan_ht = ladder([tmp_path], levels=(1.6,), reps=1)
    assert nan_ht["no_bound"] == [f"{CASE.id}/ht"] and "ht" not in {r["tensor"] for r in nan_ht["rows"]}
    assert f"- {CASE.id}/ht" in format_table(nan_ht)


def test_summary_names_the_smallest_margin():
    """The gate's summary line names the bounded tensor whose interval's upper end is closest to
    (or furthest over) the bound, ratio (hi / factor) and rounding (the nearer of eps / limit and
    c / compute_limit) methods alike;
    a tensor without a judgement (NaN/Inf candidate) is passed over."""
    ratio = lambda hi: {"compute": {"method": "ratio", "hi": hi, "factor": 2.0, "seeds": 3}}
    rounding = {"compute": {"method": "rounding", "eps_candidate": 1.8, "limit": 2.0, "seeds": 4}}
    nan = {"bound": {"compute": None}}
    cases = [
        {"case_id": "A", "candidate": "pallas", "tensors": {"o": {"bound": ratio(1.0)}, "dq": {"bound": ratio(1.86)}}},
        {"case_id": "B", "candidate": "pallas", "tensors": {"o": {"bound": rounding}, "dg": nan}},
        {"case_id": "C", "candidate": "other", "tensors": {"o": {"bound": None}}},
    ]
    result = {"cases": cases, "bound_factor": 2.0, "counts": {"pass": 3}, "failures": [], "reference_findings": []}
    result.update(unsupported=[], ok=True)
    assert "  smallest margin: hi/factor = 0.93 at A [pallas] dq (3 seed(s))" in format_summary(result).splitlines()
    cases[1]["tensors"]["o"]["bound"]["compute"]["eps_candidate"] = 2.5  # over its limit: now the smallest
    assert "smallest margin: eps/limit = 1.25 at B [pallas] o (4 seed(s))" in format_summary(result)
    # the rounding rule's other limit, on compute errors, when it is the nearer
    cases[1]["tensors"]["o"]["bound"]["compute"].update(c_candidate=3e-4, compute_limit=2e-4)
    assert "smallest margin: c/limit = 1.5 at B [pallas] o (4 seed(s))" in format_summary(result)
    result["cases"] = cases[2:]
    assert "smallest margin" not in format_summary(result)


@pytest.mark.parametrize(
    "case_id,blocks",
    [
        ("simple_gla-fwdbwd-B1-T64-H1-K256-V256-fp32-C128-g_logsig", 1),  # dg [B, T, H]
        ("gdn-fwdbwd-B1-T96-H1-K32-V32-bf16-C64-g_logsig-HV2-h0-ht-lens40_56", 2),  # dg, dbeta [B, T, HV]
        ("simple_gla-fwdbwd-B2-T128-H2-K64-V64-fp32-C128-gamma_alibi-h0", 2),  # dg_gamma [H]
        ("gla-fwdbwd-B1-T64-H1-K256-V256-fp32-C64-g_logsig", 8),  # every tensor has column groups
    ],
)
def test_power_benchmark_counts_the_blocks_the_records_hold(case_id, blocks):
    """benchmarks/power_ci.py gives each case the seeds its fewest-blocks tensor may use: its count
    from the shapes is the count compare_tensor records."""
    from benchmarks.power_ci import blocks_per_seed
    from parity.measure.compare import error_blocks
    from references import error_scales

    case = Case.from_id(case_id)
    full = cached_oracle(case, make_inputs(case))[0]
    scales = error_scales(full)
    held = min(
        len(error_blocks(case, n, full[n], full[n], full[n], scales.get(n))["err2"]) for n in case.output_names()
    )
    assert blocks_per_seed(case) == held == blocks
