"""The comparator, the tolerance model and the TPU <= GPU gate."""

import json

import ml_dtypes
import numpy as np
import pytest

from cases import Case, make_inputs
from parity.judge.bound import bound
from parity.judge.gate import GateRefusal, evaluate, format_summary, run_gate
from parity.judge.words import describe_bound, describe_localisation, fmt
from parity.measure.compare import compare_tensor, rel_rms
from parity.measure.localisation import (
    ChunkLocalisation,
    RowLocalisation,
    bound_localisation,
    localisation_record,
    read_localisation,
)
from parity.measure.tol import TOL_VERSION, calibrate, growth, output_dtype, tol
from parity.model.verdict import Verdict
from parity.pytest_plugin.checks import describe_bound_quantity
from references import oracle_run

from .helpers import SMALL_BF16, perturbed, record_from_tensors, reference_like, write_records

CASE = Case("simple_gla", 1, 128, 2, 64, 64, dtype="bfloat16", seqlens=(30, 1, 97), h0=True, ht=True)


@pytest.fixture(scope="module")
def oracle():
    return oracle_run(CASE, make_inputs(CASE))


def test_rel_rms_definition():
    r = np.array([3.0, 4.0])
    assert rel_rms(r, r) == 0.0
    assert rel_rms(r + np.array([0.3, 0.4]), r) == pytest.approx(0.1)


def test_rounded_oracle_is_exactly_at_the_floor_and_passes(oracle):
    x = oracle["o"].astype(ml_dtypes.bfloat16)
    m = compare_tensor(CASE, "o", x, oracle["o"])
    assert m["verdict"] == "pass" and m["nan"] == 0
    assert m["rel_rms"] == pytest.approx(m["floor_rel"]) and m["max_ulp"] <= 0.5 + 1e-6
    assert len(m["profile"]) == 2 and len(m["heatmap"][0]) == 2 and len(m["sequences"]) == 3


def test_nan_where_oracle_is_finite_always_fails(oracle):
    x = oracle["o"].copy()
    x[0, 5, 1, 3] = np.nan
    m = compare_tensor(CASE, "o", x, oracle["o"])
    assert m["verdict"] == "nan-inf" and m["nan"] == 1
    assert m["worst"][0]["index"] == [0, 5, 1, 3] and m["worst"][0]["value"] is None
    json.dumps(m, allow_nan=False)  # records stay strict JSON


def test_localisation_points_at_the_bad_sequence_and_chunk(oracle):
    x = oracle["o"].copy()
    x[0, 31:128, 1] += 0.2 * np.abs(oracle["o"]).mean()  # only the third packed sequence, head 1
    m = compare_tensor(CASE, "o", x, oracle["o"])
    assert m["verdict"] == "fail-accuracy"
    assert m["localisation"]["pattern"] == "one-sequence" and m["localisation"]["sequence"] == 2
    assert m["localisation"]["head"] == 1


def test_localisation_names_the_sequences_a_state_leak_reaches(oracle):
    x = oracle["o"].copy()
    x[0, 30:, 0] += 0.2 * np.abs(oracle["o"]).mean()  # sequences 1 and 2 (30:31, 31:128), not 0
    loc = compare_tensor(CASE, "o", x, oracle["o"])["localisation"]
    assert loc["pattern"] == "some-sequences" and loc["sequences"] == [1, 2] and loc["first_t"] == 30
    assert "sequences 1, 2" in describe_localisation(loc)


def test_drift_is_told_apart_from_a_local_fault():
    c = Case("simple_gla", 1, 512, 1, 64, 64)
    r = oracle_run(c.replace(direction="fwd"), make_inputs(c))["o"]
    t = np.arange(512)[None, :, None, None]
    eps = tol(c, "o")  # errors well above the tolerance, one growing along T, one in 10 steps
    drift = compare_tensor(c, "o", r * (1 + 10 * eps * t / 512), r)
    local = r.copy()
    local[0, 200:210] *= 1 + 50 * eps
    loc = compare_tensor(c, "o", local, r)
    assert drift["localisation"]["pattern"] == "drift"
    assert loc["localisation"]["pattern"] == "local" and loc["localisation"]["first_chunk"] == 3


def test_localisation_finds_the_first_bad_token_and_head_and_nan():
    c = Case("simple_gla", 1, 192, 3, 64, 64)
    r = oracle_run(c.replace(direction="fwd"), make_inputs(c))["o"]
    x = r.copy()
    x[0, 75:, 2] *= 1 + 100 * tol(c, "o")  # head 2 goes wrong from token 75 (chunk 1)
    loc = compare_tensor(c, "o", x, r)["localisation"]
    assert (loc["first_chunk"], loc["first_t"], loc["head"], loc["against"]) == (1, 75, 2, "tol")
    x = r.copy()
    x[0, 140, 1, 7] = np.nan  # one NaN: chunk 2, token 140, head 1
    m = compare_tensor(c, "o", x, r)
    assert m["verdict"] == "nan-inf"
    assert (m["localisation"]["first_chunk"], m["localisation"]["first_t"], m["localisation"]["head"]) == (2, 140, 1)
    assert describe_localisation(m["localisation"]).endswith("first over tol: chunk 2 (t=140), head 1")
    # in words, across the heads and along the sequence: only head 1 (0 and 2 within), one chunk of 3
    assert describe_localisation(m["localisation"]).startswith(
        "heads: only head 1 over tol (heads 0, 2 within); along the sequence: 1 of 3 chunks over tol"
    )


def test_state_localisation_names_the_sequence_and_head(oracle):
    ht = oracle["ht"].copy()  # [N=3, H=2, K, V]
    ht[1, 0] *= 1.5  # sequence 1, head 0
    loc = compare_tensor(CASE, "ht", ht, oracle["ht"])["localisation"]
    assert loc == {
        "against": "tol",
        "sequence": 1,
        "head": 0,
        "pattern": "one-sequence",
        "heads": [0],
        "n_heads": 2,
        "rows_over": [1],
        "n_rows": 3,
    }
    assert describe_localisation(loc) == (
        "heads: only head 0 over tol (head 1 within); sequences: sequence 1 of 3 over tol; "
        "first over tol: sequence 1, head 0"
    )


def test_a_record_holds_a_localisation_as_its_typed_value_writes_it(oracle):
    """compare_tensor writes a localisation (time tensor with packed sequences, state) that reads
    back as its type and writes again key for key, in order; a verdict is written as its word."""
    x = oracle["o"].copy()
    x[0, 30:, 0] += 0.2 * np.abs(oracle["o"]).mean()
    ht = oracle["ht"].copy()
    ht[1, 0] *= 1.5
    for name, value in (("o", x), ("ht", ht)):
        rec = compare_tensor(CASE, name, value, oracle[name])
        loc = read_localisation(rec["localisation"])
        assert isinstance(loc, ChunkLocalisation if name == "o" else RowLocalisation)
        assert list(localisation_record(loc).items()) == list(rec["localisation"].items())
        assert json.dumps(rec["verdict"]) == '"fail-accuracy"' and rec["verdict"] == Verdict.FAIL_ACCURACY
    assert read_localisation({}) is None and read_localisation({"seed": 3}) is None


def test_gate_gradient_localisation_names_the_head():
    from references import error_scales

    c = Case("simple_gla", 1, 64, 3, 64, 64, gate="gamma_alibi")
    out = oracle_run(c, make_inputs(c))
    r = out["dg_gamma"]  # [H]
    x = r.copy()
    x[2] = 0.0  # a zero gradient in head 2 (the class of parity.mutants.catalogue's zero-dg-gamma)
    m = compare_tensor(c, "dg_gamma", x, r, error_scales(out)["dg_gamma"])
    assert m["verdict"] == "fail-accuracy"
    assert m["localisation"] == {"against": "tol", "head": 2, "pattern": "one-head", "heads": [2], "n_heads": 3}
    assert describe_localisation(m["localisation"]) == "heads: only head 2 over tol (heads 0, 1 within)"


def test_bound_failure_is_localised_against_the_reference_per_chunk_and_head():
    """A candidate as good as FLA everywhere except chunk 1 of head 1, where it is 3x worse:
    its own tolerance passes, the bound fails, and the gate says where."""
    c = Case("simple_gla", 1, 256, 2, 64, 64, direction="fwd")
    r = oracle_run(c, make_inputs(c))["o"]
    rng = np.random.default_rng(1)
    noise = 0.05 * tol(c, "o") * np.abs(r).mean() * rng.standard_normal(r.shape)
    cand = r + noise
    cand[0, 64:128, 1] += 2 * noise[0, 64:128, 1]
    ref_rec = compare_tensor(c, "o", r + noise, r)
    cand_rec = compare_tensor(c, "o", cand, r)
    assert cand_rec["verdict"] == ref_rec["verdict"] == "pass" and not bound(cand_rec, ref_rec)["ok"]
    loc = bound_localisation(c, "o", cand_rec, ref_rec, 1.0)
    assert (loc.against, loc.first_chunk, loc.first_t, loc.head, loc.pattern) == (
        "bound",
        1,
        64,
        1,
        "local",
    )


def test_tolerance_grows_with_dtype_T_chunk_and_K():
    c = Case("gla", 1, 256, 1, 64, 64)
    assert tol(c.replace(dtype="bfloat16"), "o") > tol(c, "o")
    assert tol(c.replace(T=4096), "o") > tol(c, "o")
    assert tol(c.replace(chunk_size=128), "o") > tol(c, "o")
    assert tol(c.replace(K=256), "o") > tol(c, "o")
    assert tol(c, "dg") > tol(c, "o")  # gate gradients carry cancellation


def test_tolerances_in_reference_units_equal_the_old_formula():
    """The table in the reference's units (float32 as TF32, u = 2^-11) with explicit float16
    entries gives, bit for bit, the tolerances of table v4 (tests/data/tolerances_v4_before_units.json,
    read with float32 u = 2^-24 and float16 taking bfloat16's coefficients with u = 2^-11), up to
    the floor at the roundoff of the tensor's own dtype. dg_gamma has no coefficient of its own
    (test below)."""
    from pathlib import Path

    from parity.measure.tol import COEF_OF, ROUNDOFF, UNIT, coef

    old = json.loads((Path(__file__).parent / "data" / "tolerances_v4_before_units.json").read_text())["coef"]
    old_u = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
    assert UNIT == {"float32": 2.0**-11, "bfloat16": 2.0**-8, "float16": 2.0**-11}
    checked = 0
    for op in old:  # the ops of table v4 (gdn, not in it, has kda's coefficients)
        gate = "gamma_alibi" if op == "simple_gla" else "g_logsig"
        for dtype in ("float32", "bfloat16", "float16"):
            for T, C, K in ((64, 64, 64), (100, 32, 60), (2048, 128, 256), (1, 64, 128)):
                c = Case(op, 1, T, 2, K, 64, dtype=dtype, chunk_size=C, gate=gate)
                for tensor in (t for t in old[op] if t not in COEF_OF):
                    before = old[op][tensor]["bfloat16" if dtype == "float16" else dtype] * old_u[dtype] * growth(c)
                    assert tol(c, tensor) == max(before, ROUNDOFF[output_dtype(c, tensor)]), (c.id, tensor)
                    assert coef(c, tensor) > 0
                    checked += 1
    assert checked == 3 * 3 * 4 * 8


def test_dg_gamma_is_measured_per_head_against_what_it_sums():
    """dg_gamma = the sum over tokens of the per-token gate gradient (the oracle's terms, summed in
    float64 to its value), with dg's coefficient; its error is measured per head against the larger
    of |dg_gamma| and the terms' root sum of squares. On the case below (dg_gamma = 39.6 from terms
    of rms 694) float32 sums of the terms with TF32-sized errors, in two orders, are off by more
    than 2.4e-4 of the sum (a tolerance relative to the sum itself) and pass; a batch row left out
    of the sum fails, and so does a head's gradient dropped in a head 100x smaller than another
    (the class of parity.mutants.catalogue's zero-dg-gamma)."""
    from references import error_scales

    c = Case.from_id("simple_gla-fwdbwd-B2-T64-H1-K64-V64-fp32-C64-gamma_retnet-s1.0-h0-ht")
    out = oracle_run(c, make_inputs(c))
    terms, r = out["dg_gamma_terms"], out["dg_gamma"]  # [B, T, H], [H]
    np.testing.assert_allclose(terms.sum(axis=(0, 1)), r, rtol=1e-12)
    scale = error_scales(out)["dg_gamma"]
    assert scale == pytest.approx([np.sqrt(np.sum(terms**2))]) and 150 < scale[0] / abs(r[0]) < 250
    assert tol(c, "dg_gamma") == tol(c, "dg")
    t32 = (terms * (1 + 2.0**-11 * np.random.default_rng(0).standard_normal(terms.shape))).astype(np.float32)
    for x in (np.cumsum(t32.reshape(-1), dtype=np.float32)[-1:], t32[:, ::-1].sum(axis=(0, 1), dtype=np.float32)):
        assert abs(x[0] - r[0]) / abs(r[0]) > 2.0**-12
        m = compare_tensor(c, "dg_gamma", x, r, scale)
        assert m["verdict"] == "pass" and m["rel_rms"] == pytest.approx(abs(x[0] - r[0]) / scale[0])
    one_row = terms[:1].sum(axis=(0, 1))  # the second batch row's terms left out of the sum
    assert compare_tensor(c, "dg_gamma", one_row, r, scale)["verdict"] == "fail-accuracy"
    c3 = Case("simple_gla", 1, 64, 3, 64, 64, gate="gamma_alibi")
    out3 = oracle_run(c3, make_inputs(c3))
    r3, s3 = out3["dg_gamma"], error_scales(out3)["dg_gamma"]
    assert abs(r3[1]) > 100 * abs(r3[2])  # ALiBi: heads of very different magnitude
    x = r3.copy()
    x[2] = 0.0
    m = compare_tensor(c3, "dg_gamma", x, r3, s3)
    assert m["verdict"] == "fail-accuracy" and m["localisation"]["head"] == 2
    assert compare_tensor(c3, "dg_gamma", r3 * (1 + 1e-6), r3, s3)["verdict"] == "pass"


def test_calibrate_fits_coefficients_and_bumps_the_version():
    c = Case("gla", 1, 256, 1, 64, 64)
    eps = 3e-6
    table = calibrate([(c, "o", eps), (c, "o", eps / 2), (c, "dq", float("nan"))])
    from parity.measure.tol import MARGIN, UNIT

    assert table["coef"]["gla"]["o"]["float32"] == pytest.approx(MARGIN * eps / (UNIT["float32"] * growth(c)), rel=1e-3)
    assert table["version"] != TOL_VERSION
    assert table["coef"]["gla"]["dq"] == json.loads(json.dumps(table["coef"]["gla"]["dq"]))  # unchanged without samples


def test_bound_uses_factor_on_compute_error_and_floor_on_max_abs():
    """The compute error's ratio (from per-seed blocks; parity.measure.compute_error) against the
    factor, max_abs against factor x 2 x the reference's + floor_abs; no figures: inconclusive."""
    rng = np.random.default_rng(0)
    spread = 1 + 0.01 * rng.standard_normal(16)

    def rec(c2, max_abs):  # squared compute error c2 per block over a floor of 1e-6 per block
        return {
            "rel_rms": 1e-3,
            "max_abs": max_abs,
            "floor_rel": 1e-3,
            "floor_abs": 1e-3,
            "blocks": {"err2": list(1e-6 + c2 * spread), "floor2": [1e-6] * 16},
        }

    ref = rec(1e-6, 1e-2)
    assert bound(rec(1e-6, 1e-2), ref, 1.0, 1, 1)["ok"]  # a tie
    assert bound(rec(1e-6, 2.05e-2), ref, 1.0, 1, 1)["ok"]  # max_abs within 2x + its floor
    assert bound(rec(1e-6, 2.2e-2), ref, 1.0, 1, 1)["verdict"] == "fail-bound"
    assert bound(rec(2.0e-6, 1e-2), ref, 1.0, 1, 1)["verdict"] == "fail-bound"  # sqrt(2) x the compute error
    assert bound(rec(2.0e-6, 4e-2), ref, 2.5, 1, 1)["ok"]
    assert bound({**rec(1e-6, 1e-2), "rel_rms": None, "nan": 3}, ref)["verdict"] == "fail-bound"
    no_figures = {k: v for k, v in rec(1e-6, 1e-2).items() if k != "blocks"}
    assert bound(no_figures, ref)["verdict"] == "inconclusive"
    # each verdict names the rule that decided it, with that rule's figures
    assert [
        bound(*args)["rule"]
        for args in (
            (rec(1e-6, 1e-2), ref, 1.0, 1, 1),
            (rec(1e-6, 2.2e-2), ref, 1.0, 1, 1),
            (rec(2.0e-6, 1e-2), ref, 1.0, 1, 1),
            ({**rec(1e-6, 1e-2), "rel_rms": None, "nan": 3}, ref),
            (no_figures, ref),
        )
    ] == ["ratio-interval", "max-abs", "ratio-interval", "nan-inf", "no-common-seed"]
    assert describe_bound(bound(rec(1e-6, 2.2e-2), ref, 1.0, 1, 1)).startswith(
        "max-abs: max_abs 0.022 > limit 0.021 (factor 1 x 2 x the reference's 0.01 + floor_abs 0.001)"
    )
    assert "lo " in describe_bound(bound(rec(2.0e-6, 1e-2), ref, 1.0, 1, 1)).split("; ")[-1]
    # a tie on one seed with max_abs over its limit: the max-abs rule decides, the compute error said beside it
    one_seed = bound(rec(1e-6, 2.2e-2), ref, 1.0, 3, 64)
    assert one_seed["verdict"] == "fail-bound" and one_seed["rule"] == "max-abs"
    assert "; compute error within the bound: compute error 1x the reference's" in describe_bound(one_seed)


def test_a_reference_with_nan_bounds_nothing():
    """FLA's NaN elements leave its epsilons covering only the rest: no bound from them
    (seen: FLA's g_gamma state is NaN when a sequence ends early in a chunk under a strong gate)."""
    ref = {"rel_rms": 1e-9, "max_abs": 1e-9, "floor_rel": 0.0, "floor_abs": 0.0, "nan": 4096}
    b = bound({"rel_rms": 1e-3, "max_abs": 1e-2}, ref)
    assert b["ok"] and b["reference_nonfinite"] and b["rel_rms"]["limit"] is None
    assert not bound({"rel_rms": 1e-3, "max_abs": 1e-2, "inf": 1}, ref)["ok"]


def test_a_reference_nan_on_some_seeds_is_bounded_on_the_others():
    """A seed where the reference is NaN (its figures count those elements as 0 error: more accurate
    than it is) is left out of the bound; the bound runs on the seeds where it is finite, and the
    seeds left out are named (seen: FLA's varlen g_gamma ht, NaN on 8 of 64 seeds)."""
    rng = np.random.default_rng(5)

    def rec(c2, nan_seeds=()):
        seeds = [
            {
                "seed": k,
                "input_hash": f"h{k}",
                "nan": 4096 if k in nan_seeds else 0,
                "inf": 0,
                "err2": list(1e-6 + c2 * (0.02 if k in nan_seeds else 1) * (1 + 0.1 * rng.standard_normal(16))),
                "floor2": [1e-6] * 16,
            }
            for k in range(4)
        ]
        return {
            "rel_rms": 1e-3,
            "max_abs": 1e-2,
            "floor_rel": 1e-3,
            "floor_abs": 1e-3,
            "nan": seeds[0]["nan"],
            "seeds": seeds,
        }

    ref = rec(1e-6, nan_seeds=(1, 3))  # on seeds 1 and 3 its NaN elements hide nearly all its error
    b = bound(rec(1e-6), ref, 1.0, 2, 4)
    assert b["ok"] and b["reference_nonfinite_seeds"] == [1, 3] and b["compute"]["seed_list"] == [0, 2]
    assert bound(rec(4e-6), ref, 1.0, 2, 4)["verdict"] == "fail-bound"  # 2x: still caught on seeds 0 and 2
    everywhere = rec(1e-6, nan_seeds=range(4))
    assert bound(rec(1e-6), everywhere)["reference_nonfinite"]
    # NaN on every seed the candidate ran (seeds 1 and 3 of 4): no bound, as for a NaN on every seed
    odd = {**rec(1e-6), "seeds": [s for s in rec(1e-6)["seeds"] if s["seed"] in (1, 3)]}
    assert bound(odd, ref)["reference_nonfinite"] and bound(odd, ref)["ok"]


def _write(dirpath, rec):
    write_records(dirpath, rec)


@pytest.fixture(scope="module")
def fla_like():
    return reference_like(SMALL_BF16)


def test_candidate_with_twice_the_reference_error_fails_at_1_and_passes_at_4(tmp_path, fla_like):
    """Twice the reference's error (its rounding included, unrounded: 2.8x its compute error)."""
    c = SMALL_BF16
    _write(tmp_path, record_from_tensors(c, "fla", "reference", fla_like))
    _write(tmp_path, record_from_tensors(c, "twice", "candidate", perturbed(c, fla_like, 2.0)))
    strict = run_gate([tmp_path], 1.0)
    assert not strict["ok"] and {f["verdict"] for f in strict["failures"]} == {"fail-bound"}
    f = strict["failures"][0]
    assert 2.5 < f["ratio"] < 3.1 and f["interval"][0] > 1 and f["eps_candidate"] > f["eps_reference"]
    assert f["localisation"]["against"] == "bound" and "at: " in format_summary(strict)
    assert f["rule"] == "ratio-interval" and f"fail-bound, decided by {f['why']}" in format_summary(strict)
    # the command that reproduces it right under the failure, as the plugin prints it
    assert f["repro"].startswith("parity run") and f"\n       repro: {f['repro']}" in format_summary(strict)
    # the plugin's bound line names the quantity it compares, with the reference's figure the limit comes from
    b = strict["cases"][0]["tensors"][f["tensor"]]["bound"]
    line = describe_bound_quantity(b, "twice", "fla")
    assert line.startswith("bound on the compute error (the error apart from the output's rounding), over")
    assert f"limit {fmt(b['rel_rms']['limit'])} = factor 1 x c_fla = {fmt(b['rel_rms']['reference'])}" in line
    assert run_gate([tmp_path], 4.0)["ok"]


def test_separate_runs_gate_like_one_combined_run(tmp_path, fla_like):
    c = SMALL_BF16
    ref = record_from_tensors(c, "fla", "reference", fla_like)
    cand = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 0.5))
    _write(tmp_path / "combined", ref)
    _write(tmp_path / "combined", cand)
    _write(tmp_path / "gpu", ref)
    _write(tmp_path / "tpu", cand)
    one = run_gate([tmp_path / "combined"])
    two = run_gate([tmp_path / "gpu", tmp_path / "tpu"])
    assert one["ok"] and one["cases"] == two["cases"] and one["failures"] == two["failures"] == []


def test_gate_refuses_tampered_hash_missing_side_and_other_versions(tmp_path, fla_like):
    c = SMALL_BF16
    ref = record_from_tensors(c, "fla", "reference", fla_like)
    cand = record_from_tensors(c, "pallas", "candidate", fla_like)
    for field, value, message in [
        ("input_hash", "0" * 64, "input_hash differs"),
        ("oracle_version", "999", "oracle_version differs"),
        ("tol_version", "999", "tol_version differs"),
    ]:
        bad = {**cand, field: value}
        with pytest.raises(GateRefusal, match=message):
            evaluate({c.id: {"fla": ref, "pallas": bad}})
    with pytest.raises(GateRefusal, match="no 'fla' \\(reference\\)"):
        evaluate({c.id: {"pallas": cand}})
    with pytest.raises(GateRefusal, match="no candidate"):
        evaluate({c.id: {"fla": ref}})
    _write(tmp_path, {**cand, "schema": 999})
    with pytest.raises(GateRefusal, match="schema 999"):
        run_gate([tmp_path])


def test_gate_cli_exit_codes(tmp_path, fla_like):
    from parity.cli import main

    c = SMALL_BF16
    _write(tmp_path / "ok", record_from_tensors(c, "fla", "reference", fla_like))
    _write(tmp_path / "ok", record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 0.5)))
    assert main(["gate", str(tmp_path / "ok")]) == 0
    _write(tmp_path / "bad", record_from_tensors(c, "fla", "reference", fla_like))
    _write(tmp_path / "bad", record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 2.0)))
    assert main(["gate", str(tmp_path / "bad")]) == 1
    assert main(["gate", str(tmp_path / "bad"), "--bound-factor", "4"]) == 0
    _write(tmp_path / "half", record_from_tensors(c, "pallas", "candidate", fla_like))
    assert main(["gate", str(tmp_path / "half")]) == 2


def test_a_failed_reference_leaves_the_pair_on_its_tolerance_and_says_so(fla_like):
    """FLA refusing a case (seen on an H100 with Triton 3.6: gated backward) bounds nothing;
    the candidate is judged on its own tolerance and the summary names the unbounded pair."""
    c = SMALL_BF16
    ref = {
        **record_from_tensors(c, "fla", "reference", fla_like),
        "status": "error",
        "tensors": {},
        "error": "RuntimeError: FLA refused",
    }
    good = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 0.5))
    result = evaluate({c.id: {"fla": ref, "pallas": good}})
    assert result["ok"] and result["unbounded"][0]["tensors"] == list(good["tensors"])
    assert "bound not enforced" in format_summary(result) and "REFERENCE" in format_summary(result)
    bad = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 1e4))
    assert not evaluate({c.id: {"fla": ref, "pallas": bad}})["ok"]  # its own tolerance still holds it
