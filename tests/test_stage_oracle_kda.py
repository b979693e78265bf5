"""The float64 stage oracle of KDA (references/stages/kda.py) and its stage inputs.

Composed in float64 from the op's inputs, the stages reproduce the whole-op oracle to 1e-12:
o from fwd_intra + fwd_h + fwd_o, ht from fwd_h, dh0 from bwd_dhu, dv from bwd_wy, and dq, dk,
dbeta, dg from bwd_intra (dq, dk summed over each head's G value heads; dg the reverse
chunk-local cumsum, as FLA's op takes them). stage_inputs gives exactly the registry's names,
shapes and dtypes, deterministically; FLA's own stage functions (Triton interpreter) agree with
the oracle to their float32 (TF32) rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases import Case, make_inputs
from cases.stages import STAGE_ORDER, stage_shapes
from cases.stages.kda import output_mask
from references import oracle_run
from references.stages import kda as S
from references.stages import stage_inputs, stage_oracle
from tests.stage_helpers import (
    check_stage_inputs,
    fla_stage_runs,
    float64_stage_outputs,
    rel,
    reverse_local_cumsum,
    skip_on_cuda,
    stage_case,
)

OP_CASES = [
    "kda-fwdbwd-B2-T100-H2-K32-V16-fp32-C32-g_logsig-h0-ht",
    "kda-fwdbwd-B2-T100-H2-K16-V32-fp32-C64-g_stress-h0",
    "kda-fwdbwd-B1-T100-H2-K32-V16-fp32-C32-g_logsig-HV4-h0-ht-lens37_1_62",
    "kda-fwdbwd-B1-T100-H1-K16-V16-bf16-C64-g_stress-HV2-ht-lens37_1_62",
]


def head_sum(case, x: np.ndarray) -> np.ndarray:
    """[B, T, HV, K] -> [B, T, H, K]: the sum over each q, k head's G value heads."""
    return x.reshape(x.shape[:2] + (case.H, case.G, x.shape[-1])).sum(3)


@pytest.mark.parametrize("cid", OP_CASES)
def test_stages_compose_to_the_op_oracle(cid):
    """local_cumsum, fwd_intra, fwd_h, fwd_o, bwd_dAv, bwd_dhu, bwd_wy, bwd_intra chained in
    float64 on the op's inputs give the whole-op oracle's outputs to 1e-12 relative."""
    case = Case.from_id(cid)
    x = make_inputs(case)
    ref = oracle_run(case, x)
    f = {n: np.asarray(a, np.float64) for n, a in x.items() if n != "cu_seqlens"}
    h0, dht = f.get("initial_state"), f.get("dht")
    gk = S.local_cumsum(case, f["g"])
    intra = S.fwd_intra(case, f["q"], f["k"], f["v"], gk, f["beta"])
    h, v_new, ht = S.fwd_h(case, intra["kg"], intra["w"], intra["u"], gk, h0)
    qg = f["q"].repeat(case.G, axis=2) * np.exp2(gk)
    dAqk, dv_a = S.bwd_dAv(case, v_new, f["do"], intra["Aqk"])
    dh, dh0, dv_b = S.bwd_dhu(case, qg, intra["kg"], intra["w"], gk, f["do"], dv_a, dht)
    wy = S.bwd_wy(case, f["q"], f["k"], f["v"], v_new, gk, f["beta"], intra["Akk"], h, f["do"], dh, dv_b)
    grads = S.bwd_intra(case, f["q"], f["k"], gk, f["beta"], dAqk, wy["dAkk"], wy["dq"], wy["dk"], wy["db"], wy["dg"])
    got = {
        "o": S.fwd_o(case, f["q"], v_new, gk, intra["Aqk"], h),
        "ht": ht,
        "dh0": dh0,
        "dv": wy["dv"],
        "dq": head_sum(case, grads["dq"]),
        "dk": head_sum(case, grads["dk"]),
        "dbeta": grads["db"],
        "dg": reverse_local_cumsum(case, grads["dg"]),
    }
    assert set(case.output_names()) <= set(got)
    for name in case.output_names():
        assert rel(got[name], ref[name]) < 1e-12, (name, rel(got[name], ref[name]))


@pytest.mark.parametrize("cid", OP_CASES[:3])
def test_stage_oracle_runs_on_the_float64_stage_inputs(cid):
    """oracle_run of every stage case on stage_inputs_f64 (its inputs before their cast) gives
    the float64 chain's intermediates: each stage's outputs are the next stage's inputs, and
    the last ones are the op oracle's."""
    op_case = Case.from_id(cid)
    x = make_inputs(op_case)
    ref = oracle_run(op_case, x)
    out = float64_stage_outputs(op_case, x, S.stage_inputs_f64, STAGE_ORDER["kda"])
    f64 = {s: S.stage_inputs_f64(stage_case(op_case, s), x) for s in STAGE_ORDER["kda"]}
    np.testing.assert_array_equal(f64["fwd_intra"]["gk"], out["local_cumsum"]["g_cumsum"])
    np.testing.assert_array_equal(f64["fwd_h"]["k"], out["fwd_intra"]["kg"])
    np.testing.assert_array_equal(f64["fwd_o"]["A"], out["fwd_intra"]["Aqk"])
    np.testing.assert_array_equal(f64["fwd_o"]["v"], out["fwd_h"]["v_new"])
    np.testing.assert_array_equal(f64["bwd_wy"]["h"], out["fwd_h"]["h"])
    np.testing.assert_array_equal(f64["bwd_dhu"]["dv"], out["bwd_dAv"]["dv"])
    np.testing.assert_array_equal(f64["bwd_wy"]["dv"], out["bwd_dhu"]["dv"])
    np.testing.assert_array_equal(f64["bwd_wy"]["dh"], out["bwd_dhu"]["dh"])
    np.testing.assert_array_equal(f64["bwd_intra"]["dAqk"], out["bwd_dAv"]["dAqk"])
    np.testing.assert_array_equal(f64["bwd_intra"]["dAkk"], out["bwd_wy"]["dAkk"])
    np.testing.assert_array_equal(f64["bwd_intra"]["dg"], out["bwd_wy"]["dg"])
    assert rel(out["fwd_o"]["o"], ref["o"]) < 1e-12
    assert rel(out["bwd_wy"]["dv"], ref["dv"]) < 1e-12
    assert rel(head_sum(op_case, out["bwd_intra"]["dq"]), ref["dq"]) < 1e-12
    assert rel(head_sum(op_case, out["bwd_intra"]["dk"]), ref["dk"]) < 1e-12
    assert rel(out["bwd_intra"]["db"], ref["dbeta"]) < 1e-12
    assert rel(reverse_local_cumsum(op_case, out["bwd_intra"]["dg"]), ref["dg"]) < 1e-12
    if op_case.ht:
        assert rel(out["fwd_h"]["ht"], ref["ht"]) < 1e-12
    if op_case.h0:
        assert rel(out["bwd_dhu"]["dh0"], ref["dh0"]) < 1e-12


@pytest.mark.parametrize("cid", OP_CASES)
def test_stage_inputs_names_shapes_dtypes(cid):
    """stage_inputs gives stage_input_names (and cu_seqlens int64 for varlen) in the registry's
    shapes and dtypes; the op's own tensors are its bytes; the rest is the float64 value rounded
    once; the oracle's outputs have the registry's shapes; two calls give the same bytes."""
    op_case = Case.from_id(cid)
    for stage in STAGE_ORDER["kda"]:
        own = {"do": "do", "beta": "beta", "h0": "initial_state", "initial_state": "initial_state", "dht": "dht"}
        if stage not in ("fwd_h", "bwd_dhu"):  # there q, k are qg, kg
            own.update(q="q", k="k")
        check_stage_inputs(stage_case(op_case, stage), S.stage_inputs_f64, own)


def test_registry_refuses_what_fla_does_not_take():
    """chunk sizes other than 32 and 64 (FLA's KDA kernels raise) and K > 256."""
    with pytest.raises(ValueError, match="chunk_size 128"):
        Case.from_id("kda:fwd_h-fwd-B1-T256-H2-K64-V64-fp32-C128-g_stress-h0-ht")
    with pytest.raises(ValueError, match="K = 512"):
        Case.from_id("kda:fwd_o-fwd-B1-T64-H1-K512-V64-fp32-C64-g_logsig")


def test_aqk_mask():
    """output_mask marks Aqk's lower triangle per chunk (positions counted per sequence); the
    oracle's Aqk is 0 outside it."""
    c = Case.from_id("kda:fwd_intra-fwd-B1-T100-H2-K16-V16-fp32-C32-g_logsig-lens37_1_62")
    m = output_mask(c, "Aqk")
    assert m.shape == stage_shapes(c)["Aqk"]
    assert m[0, 36, 0, 4] and not m[0, 36, 0, 5]  # token 36: position 4 of its second chunk
    assert m[0, 37, 0, 0] and not m[0, 37, 0, 1]  # the length-1 sequence
    assert m[0, 38 + 33, 1, 1] and not m[0, 38 + 33, 1, 2]
    out = stage_oracle(c, stage_inputs(c, make_inputs(c.op_case)))
    assert not np.any(out["Aqk"][~m])
    assert output_mask(c, "Akk") is None


def test_fla_stage_functions_agree():
    """FLA 0.6.0's stage functions (Triton interpreter, TF32 dots) agree with the oracle to about
    1e-3 relative on a varlen grouped float32 case (Aqk judged on output_mask)."""
    torch = pytest.importorskip("torch")
    skip_on_cuda(torch)
    op_case = Case.from_id("kda-fwdbwd-B1-T60-H1-K16-V16-fp32-C32-g_stress-HV2-h0-ht-lens37_1_22")
    for c, got, ref in fla_stage_runs(op_case):
        for n in c.output_names():
            m = output_mask(c, n)
            a = got[n] if m is None else np.where(m, got[n], 0.0)
            assert rel(a, ref[n]) < 5e-3, (c.stage, n, rel(a, ref[n]))


@pytest.mark.parametrize("stage", ["fwd_intra", "bwd_intra"])
def test_split_decays_match_the_masked_exponent(monkeypatch, stage):
    """The factored decays (exp2(G - G_0) exp2(G_0 - G), used below SPLIT_LIMIT) and the masked
    per-pair exponent (used past it) give the same stage outputs to float64 rounding."""
    c = stage_case(Case.from_id(OP_CASES[2]), stage)
    inputs = stage_inputs(c, make_inputs(c.op_case))
    split = stage_oracle(c, inputs)
    monkeypatch.setattr(S, "SPLIT_LIMIT", 0.0)
    masked = stage_oracle(c, inputs)
    for n in c.output_names():
        assert rel(split[n], masked[n]) < 1e-13, (n, rel(split[n], masked[n]))
