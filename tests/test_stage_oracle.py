"""The float64 stage oracle of Simple GLA (references/stages) and the stage inputs.

Composed in float64 from the op's inputs, the stages reproduce the whole-op oracle to 1e-12:
o, ht from fwd_h + fwd_o; dh0 from bwd_dh; dv from bwd_dv; dq, dk from bwd_dqkwg; the op's dg is
the reverse chunk-local cumsum of bwd_dqkwg's dg, unscaled (FLA's op takes the same: its stage dg
is the gradient w.r.t. the natural-log cumsum). stage_inputs gives exactly the registry's names,
shapes and dtypes, deterministically; FLA's own stage functions (Triton interpreter) agree with
the oracle to their float32 (TF32) rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases import Case, make_inputs
from cases.stages import STAGE_ORDER
from references import oracle_run
from references.stages import simple_gla as S
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

# stage inputs passed as the op's own bytes: stage input -> op input
OWN = {"q": "q", "k": "k", "v": "v", "do": "do", "h0": "initial_state", "dht": "dht"}

OP_CASES = [
    "simple_gla-fwdbwd-B2-T100-H2-K32-V16-fp32-C16-g_logsig-h0-ht",
    "simple_gla-fwdbwd-B2-T100-H2-K32-V16-fp32-C32-g_logsig",
    "simple_gla-fwdbwd-B1-T100-H2-K32-V16-fp32-C64-g_logsig-h0-ht-lens37_1_62",
    "simple_gla-fwdbwd-B1-T100-H2-K16-V32-bf16-C16-g_stress-ht-lens37_1_62",
    "simple_gla-fwdbwd-B2-T100-H2-K32-V16-fp32-C64-g_stress-h0",
    "simple_gla-fwdbwd-B2-T100-H2-K32-V16-fp32-C32-gamma_alibi-h0-ht",
    "simple_gla-fwdbwd-B1-T100-H3-K16-V16-bf16-C16-gamma_retnet-h0-ht-lens37_1_62",
    "simple_gla-fwdbwd-B2-T100-H2-K32-V16-fp32-C64-gamma_stress",
]


@pytest.mark.parametrize("cid", OP_CASES)
def test_stages_compose_to_the_op_oracle(cid):
    """fwd_h, fwd_o, bwd_dh, bwd_dv, bwd_dqkwg chained in float64 on the op's inputs give the
    whole-op oracle's o, ht, dh0, dv, dq, dk, dg to 1e-12 relative."""
    case = Case.from_id(cid)
    x = make_inputs(case)
    ref = oracle_run(case, x)
    f = {n: np.asarray(a, np.float64) for n, a in x.items() if n != "cu_seqlens"}
    gate = f["g_gamma"] * S.RCP_LN2 if case.uses_g_gamma else S.local_cumsum(case, f["g"])
    h, ht = S.fwd_h(case, f["k"], f["v"], gate, f.get("initial_state"))
    dh, dh0 = S.bwd_dh(case, f["q"], f["do"], gate, f.get("dht"))
    dq, dk, dg = S.bwd_dqkwg(case, f["q"], f["k"], f["v"], f["do"], h, dh, gate)
    got = {
        "o": S.fwd_o(case, f["q"], f["k"], f["v"], h, gate),
        "ht": ht,
        "dh0": dh0,
        "dv": S.bwd_dv(case, f["q"], f["k"], f["do"], dh, gate),
        "dq": dq,
        "dk": dk,
    }
    if not case.uses_g_gamma:
        got["dg"] = reverse_local_cumsum(case, dg)
    else:
        assert dg is None
    for name in set(got) & set(case.output_names()):
        assert rel(got[name], ref[name]) < 1e-12, (name, rel(got[name], ref[name]))
    assert set(case.output_names()) - set(got) <= {"dg_gamma"}


@pytest.mark.parametrize("cid", OP_CASES[:4] + OP_CASES[5:6])
def test_stage_oracle_runs_on_the_float64_stage_inputs(cid):
    """oracle_run of every stage case on stage_inputs_f64 (its inputs before their cast) is the
    composition above: the float64 intermediates (h, dh, the log2 gate) are the stages' own
    outputs, and the outputs match the op oracle's."""
    op_case = Case.from_id(cid)
    x = make_inputs(op_case)
    ref = oracle_run(op_case, x)
    stages = [s for s in STAGE_ORDER["simple_gla"] if not (s == "local_cumsum" and op_case.uses_g_gamma)]
    out = float64_stage_outputs(op_case, x, S.stage_inputs_f64, stages)
    c = stage_case(op_case, "bwd_dqkwg")
    f64 = S.stage_inputs_f64(c, x)
    np.testing.assert_array_equal(f64["h"], out["fwd_h"]["h"])
    np.testing.assert_array_equal(f64["dh"], out["bwd_dh"]["dh"])
    if not op_case.uses_g_gamma:
        np.testing.assert_array_equal(f64["g"], out["local_cumsum"]["g_cumsum"])
        assert rel(reverse_local_cumsum(op_case, out["bwd_dqkwg"]["dg"]), ref["dg"]) < 1e-12
    assert rel(out["fwd_o"]["o"], ref["o"]) < 1e-12
    assert rel(out["bwd_dv"]["dv"], ref["dv"]) < 1e-12
    assert rel(out["bwd_dqkwg"]["dq"], ref["dq"]) < 1e-12
    assert rel(out["bwd_dqkwg"]["dk"], ref["dk"]) < 1e-12
    if op_case.ht:
        assert rel(out["fwd_h"]["ht"], ref["ht"]) < 1e-12
    if op_case.h0:
        assert rel(out["bwd_dh"]["dh0"], ref["dh0"]) < 1e-12


@pytest.mark.parametrize("cid", OP_CASES)
def test_stage_inputs_names_shapes_dtypes(cid):
    """stage_inputs gives stage_input_names (and cu_seqlens int64 for varlen) in the registry's
    shapes and dtypes; q, k, v, do are the op's own bytes; the rest is the float64 value rounded
    once; the oracle's outputs have the registry's shapes; two calls give the same bytes."""
    op_case = Case.from_id(cid)
    for stage in STAGE_ORDER["simple_gla"]:
        if stage == "local_cumsum" and op_case.uses_g_gamma:
            continue
        check_stage_inputs(stage_case(op_case, stage), S.stage_inputs_f64, OWN)


def test_gate_inputs():
    """The g gate is float32(chunk-local cumsum of the float64 g / ln 2), restarting at every
    packed sequence; g_gamma is float32(g_gamma / ln 2); local_cumsum takes the raw g."""
    c = stage_case(Case.from_id(OP_CASES[2]), "fwd_o")
    x = make_inputs(c.op_case)
    g = x["g"][0].astype(np.float64)
    want = np.concatenate([np.cumsum(g[s:e], 0) for s, e in ((0, 37), (37, 38), (38, 100))]) / np.log(2)
    np.testing.assert_allclose(stage_inputs(c, x)["g"][0], want.astype(np.float32), rtol=1e-6)
    cs = c.replace(stage="local_cumsum")
    assert stage_inputs(cs, make_inputs(cs.op_case))["g"].tobytes() == x["g"].tobytes()
    cg = stage_case(Case.from_id(OP_CASES[5]), "fwd_h")
    xg = make_inputs(cg.op_case)
    np.testing.assert_array_equal(stage_inputs(cg, xg)["g_gamma"], (xg["g_gamma"] * S.RCP_LN2).astype(np.float32))


def test_large_case_is_fast():
    """A T=512, H=4, K=V=128 stage case: inputs and oracle in well under a few seconds."""
    import time

    c = Case.from_id("simple_gla:bwd_dqkwg-fwd-B1-T512-H4-K128-V128-bf16-C64-g_logsig-h0-ht")
    t0 = time.perf_counter()
    stage_oracle(c, stage_inputs(c, make_inputs(c.op_case)))
    assert time.perf_counter() - t0 < 5


def test_fla_stage_functions_agree():
    """FLA 0.6.0's stage functions (Triton interpreter, TF32 dots) agree with the oracle to about
    1e-3 relative on a varlen float32 case: the same semantics (a wrong convention, e.g. dg
    w.r.t. the log2 cumsum, would be off by 30%)."""
    torch = pytest.importorskip("torch")
    skip_on_cuda(torch)
    op_case = Case.from_id("simple_gla-fwdbwd-B1-T40-H2-K32-V32-fp32-C16-g_stress-h0-ht-lens17_1_22")
    for c, got, ref in fla_stage_runs(op_case):
        for n in c.output_names():
            assert rel(got[n], ref[n]) < 5e-3, (c.stage, n)
