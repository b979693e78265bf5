"""The float64 stage oracle of GDN (references/stages/gdn.py) and its stage inputs.

Composed in float64 from the op's inputs, the stages reproduce the whole-op oracle to 1e-12:
o, ht from fwd_intra + fwd_h + fwd_o; dh0 from bwd_dhu; dq from bwd_dqkwg; dk = bwd_dqkwg's dk +
bwd_wy's dk2; dv and dbeta from bwd_wy; the op's dg is the reverse chunk-local cumsum of
bwd_dqkwg's dg + bwd_wy's dg2, unscaled (FLA's op takes the same). stage_inputs gives exactly
the registry's names, shapes and dtypes, deterministically; FLA's own stage functions (Triton
interpreter) agree with the oracle to their float32 (TF32) rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases import Case, make_inputs
from cases.stages import STAGE_ORDER, stage_input_names
from references import oracle_run
from references.stages import gdn as S
from references.stages import stage_inputs, stage_oracle
from tests.stage_helpers import (
    check_stage_inputs,
    float64_stage_outputs,
    rel,
    reverse_local_cumsum,
    skip_on_cuda,
    stage_case,
)

OP_CASES = [
    "gdn-fwdbwd-B2-T100-H2-K32-V16-fp32-C16-g_logsig-h0-ht",
    "gdn-fwdbwd-B2-T100-H2-K32-V16-fp32-C32-g_logsig",
    "gdn-fwdbwd-B1-T100-H2-K32-V16-fp32-C64-g_logsig-h0-ht-lens37_1_62",
    "gdn-fwdbwd-B1-T100-H1-K16-V32-bf16-C16-g_stress-ht-HV2-lens37_1_62",
    "gdn-fwdbwd-B2-T100-H2-K32-V16-fp32-C64-g_stress-h0",
    "gdn-fwdbwd-B1-T64-H2-K16-V16-fp32-C32-g_logsig-HV4-h0",
]


@pytest.mark.parametrize("cid", OP_CASES)
def test_stages_compose_to_the_op_oracle(cid):
    """The stages chained in float64 on the op's inputs give the whole-op oracle's o, ht, dq, dk,
    dv, dg, dbeta, dh0 to 1e-12 relative."""
    case = Case.from_id(cid)
    x = make_inputs(case)
    ref = oracle_run(case, x)
    f = {n: np.asarray(a, np.float64) for n, a in x.items() if n != "cu_seqlens"}
    g2 = S.local_cumsum(case, f["g"])
    w, u, A = S.fwd_intra(case, f["k"], f["v"], g2, f["beta"])
    h, v_new, ht = S.fwd_h(case, f["k"], w, u, g2, f.get("initial_state"))
    o = S.fwd_o(case, f["q"], f["k"], v_new, h, g2)
    dv = S.bwd_dv_local(case, f["q"], f["k"], f["do"], g2)
    dh, dh0, dv2 = S.bwd_dhu(case, f["q"], f["k"], w, f["do"], dv, g2, f.get("dht"))
    dq, dk, dw, dg = S.bwd_dqkwg(case, f["q"], f["k"], v_new, f["do"], h, dh, w, g2, dv2)
    dk2, dv_op, db, dg2 = S.bwd_wy(case, f["k"], f["v"], f["beta"], A, dw, dv2, g2)
    got = {
        "o": o,
        "ht": ht,
        "dh0": dh0,
        "dq": dq,
        "dk": dk + dk2,
        "dv": dv_op,
        "dbeta": db,
        "dg": reverse_local_cumsum(case, dg + dg2),
    }
    assert set(case.output_names()) <= set(got)
    for name in case.output_names():
        assert rel(got[name], ref[name]) < 1e-12, (name, rel(got[name], ref[name]))


@pytest.mark.parametrize("cid", OP_CASES[2:4])
def test_stage_oracle_runs_on_the_float64_stage_inputs(cid):
    """oracle_run of every stage case on stage_inputs_f64 (its inputs before their cast) is the
    composition above: the float64 intermediates are the stages' own outputs."""
    op_case = Case.from_id(cid)
    x = make_inputs(op_case)
    ref = oracle_run(op_case, x)
    out = float64_stage_outputs(op_case, x, S.stage_inputs_f64, STAGE_ORDER["gdn"])
    f64 = S.stage_inputs_f64(stage_case(op_case, "bwd_wy"), x)
    np.testing.assert_array_equal(f64["g"], out["local_cumsum"]["g_cumsum"])
    np.testing.assert_array_equal(f64["A"], out["fwd_intra"]["A"])
    np.testing.assert_array_equal(f64["dw"], out["bwd_dqkwg"]["dw"])
    np.testing.assert_array_equal(f64["du"], out["bwd_dhu"]["dv2"])
    f64 = S.stage_inputs_f64(stage_case(op_case, "bwd_dqkwg"), x)
    np.testing.assert_array_equal(f64["h"], out["fwd_h"]["h"])
    np.testing.assert_array_equal(f64["v"], out["fwd_h"]["v_new"])
    np.testing.assert_array_equal(f64["dh"], out["bwd_dhu"]["dh"])
    np.testing.assert_array_equal(f64["dv"], out["bwd_dhu"]["dv2"])
    assert rel(out["fwd_o"]["o"], ref["o"]) < 1e-12
    assert rel(out["bwd_wy"]["dv"], ref["dv"]) < 1e-12
    assert rel(out["bwd_wy"]["db"], ref["dbeta"]) < 1e-12
    assert rel(out["bwd_dqkwg"]["dq"], ref["dq"]) < 1e-12
    assert rel(out["bwd_dqkwg"]["dk"] + out["bwd_wy"]["dk2"], ref["dk"]) < 1e-12
    dg = reverse_local_cumsum(op_case, out["bwd_dqkwg"]["dg"] + out["bwd_wy"]["dg2"])
    assert rel(dg, ref["dg"]) < 1e-12
    if op_case.ht:
        assert rel(out["fwd_h"]["ht"], ref["ht"]) < 1e-12
    if op_case.h0:
        assert rel(out["bwd_dhu"]["dh0"], ref["dh0"]) < 1e-12


@pytest.mark.parametrize("cid", OP_CASES[2:4] + OP_CASES[5:])
def test_stage_inputs_names_shapes_dtypes(cid):
    """stage_inputs gives stage_input_names (and cu_seqlens int64 for varlen) in the registry's
    shapes and dtypes; the op's own inputs are its bytes; the rest is the float64 value rounded
    once; the oracle's outputs have the registry's shapes; two calls give the same bytes."""
    op_case = Case.from_id(cid)
    for stage in STAGE_ORDER["gdn"]:
        own = {"q": "q", "k": "k", "beta": "beta", "do": "do", "initial_state": "initial_state", "h0": "initial_state"}
        got, x = check_stage_inputs(stage_case(op_case, stage), S.stage_inputs_f64, own)
        if stage == "local_cumsum":
            assert got["g"].tobytes() == x["g"].tobytes()


def test_A_layout():
    """A [B, T, HV, C]: row i of a chunk holds (I + M)^-1's row i (unit diagonal at its chunk
    position, zero above it and past a short chunk's end)."""
    c = stage_case(Case.from_id(OP_CASES[2]), "fwd_intra")
    A = stage_oracle(c, stage_inputs(c, make_inputs(c.op_case)))["A"][0]  # [T, HV, C]
    for s, e in ((0, 37), (37, 38), (38, 100)):
        for cs in range(s, e, 64):
            L = min(64, e - cs)
            blk = A[cs : cs + L]  # [L, HV, C]
            np.testing.assert_array_equal(blk[np.arange(L), :, np.arange(L)], 1.0)
            assert not np.any(np.triu(np.moveaxis(blk, 1, 0)[:, :, :L], 1))
            assert not np.any(blk[:, :, L:])


def test_chunk_128_is_refused():
    """FLA 0.6.0's gdn stages take chunk sizes 16, 32, 64 only: a chunk-128 stage case is invalid."""
    with pytest.raises(ValueError, match="chunk_size"):
        Case.from_id("gdn:fwd_h-fwd-B1-T256-H2-K64-V64-fp32-C128-g_logsig")


def test_fla_stage_functions_agree():
    """FLA 0.6.0's stage functions (Triton interpreter, TF32 dots) agree with the oracle to about
    1e-3 relative on a varlen float32 case with grouped value heads (prepare_wy_repr_bwd called
    without chunk_size, which it does not take)."""
    torch = pytest.importorskip("torch")
    skip_on_cuda(torch)
    from parity.execute.backends import fla as fla_backend
    from parity.execute.backends.stage_calling import call_kwargs, stage_results

    op_case = Case.from_id("gdn-fwdbwd-B1-T40-H1-K32-V32-fp32-C16-g_logsig-h0-ht-HV2-lens17_1_22")
    x = make_inputs(op_case)
    for stage in STAGE_ORDER["gdn"]:
        c = stage_case(op_case, stage)
        inputs = stage_inputs(c, x if c.op_case == op_case else make_inputs(c.op_case))
        fn = fla_backend._kernel(c, cuda=False)
        tensors = {n: torch.from_numpy(inputs[n]) for n in stage_input_names(c)}
        kw = call_kwargs(c, tensors, torch.from_numpy(inputs["cu_seqlens"]))
        with torch.no_grad(), np.errstate(all="ignore"):
            got = stage_results(c, fn(**kw))
        ref = stage_oracle(c, inputs)
        for n in c.output_names():
            assert rel(got[n].double().numpy(), ref[n]) < 5e-3, (stage, n, rel(got[n].double().numpy(), ref[n]))
