"""The float64 stage oracle of GLA (references/stages/gla.py) and the stage inputs.

Composed in float64 from the op's inputs, the stages reproduce the whole-op oracle to 1e-12:
o, ht from fwd_h + fwd_intra + fwd_o; dh0 from bwd_dh; dv from bwd_dv; dq, dk, dg from bwd_dA +
bwd_dqk_intra + bwd_dqkg (FLA's bwd_dqkg returns the gradient of the op's raw g: the reverse
chunk-local cumsum is inside it). stage_inputs gives exactly the registry's names, shapes and
dtypes, deterministically; FLA's own stage functions (Triton interpreter) agree with the oracle
to their float32 (TF32) rounding, A's undefined entries masked (cases.stages.gla.mask_undefined).
"""

from __future__ import annotations

import numpy as np
import pytest

from cases import Case, make_inputs
from cases.stages import STAGE_ORDER
from cases.stages.gla import chunk_positions, mask_undefined
from references import oracle_run
from references.stages import gla as S
from references.stages import stage_inputs, stage_oracle
from tests.stage_helpers import (
    check_stage_inputs,
    fla_stage_runs,
    float64_stage_outputs,
    rel,
    stage_case,
)

# stage inputs passed as the op's own bytes: stage input -> op input
OWN = {"q": "q", "k": "k", "v": "v", "do": "do", "h0": "initial_state", "dht": "dht"}

OP_CASES = [
    "gla-fwdbwd-B2-T100-H2-K32-V16-fp32-C16-g_logsig-h0-ht",
    "gla-fwdbwd-B2-T100-H2-K32-V16-fp32-C32-g_logsig",
    "gla-fwdbwd-B1-T100-H2-K32-V16-fp32-C64-g_logsig-h0-ht-lens37_1_62",
    "gla-fwdbwd-B1-T100-H2-K16-V32-bf16-C16-g_stress-ht-lens37_1_62",
    "gla-fwdbwd-B1-T160-H2-K32-V16-fp32-C128-g_stress-h0-ht",
]


def compose(case: Case, x: dict) -> dict:
    """The op's outputs from the stages chained in float64 on its inputs."""
    f = {n: np.asarray(a, np.float64) for n, a in x.items() if n != "cu_seqlens"}
    g = S.local_cumsum(case, f["g"])
    h, ht = S.fwd_h(case, f["k"], f["v"], g, f.get("initial_state"))
    A = S.fwd_intra(case, f["q"], f["k"], g)
    dh, dh0 = S.bwd_dh(case, f["q"], f["do"], g, f.get("dht"))
    dqi, dki = S.bwd_dqk_intra(case, f["q"], f["k"], g, S.bwd_dA(case, f["v"], f["do"]))
    dq, dk, dg = S.bwd_dqkg(case, f["q"], f["k"], f["v"], h, g, f["do"], dh, dqi, dki)
    o = S.fwd_o(case, f["q"], f["v"], g, A, h)
    return {"o": o, "ht": ht, "dh0": dh0, "dv": S.bwd_dv(case, f["k"], g, A, f["do"], dh), "dq": dq, "dk": dk, "dg": dg}


@pytest.mark.parametrize("cid", OP_CASES)
def test_stages_compose_to_the_op_oracle(cid):
    """All stages chained in float64 on the op's inputs give the whole-op oracle's o, ht, dh0,
    dv, dq, dk, dg to 1e-12 relative."""
    case = Case.from_id(cid)
    x = make_inputs(case)
    ref = oracle_run(case, x)
    got = compose(case, x)
    assert set(case.output_names()) <= set(got)
    for name in case.output_names():
        assert rel(got[name], ref[name]) < 1e-12, (name, rel(got[name], ref[name]))


@pytest.mark.parametrize("cid", OP_CASES[:4])
def test_stage_oracle_runs_on_the_float64_stage_inputs(cid):
    """oracle_run of every stage case on stage_inputs_f64 (its inputs before their cast): the
    float64 intermediates (g, A, h, dh, dA, the intra dq, dk) are the upstream stages' own
    outputs, and the last stages' outputs are the op oracle's."""
    op_case = Case.from_id(cid)
    x = make_inputs(op_case)
    ref = oracle_run(op_case, x)
    out = float64_stage_outputs(op_case, x, S.stage_inputs_f64, STAGE_ORDER["gla"])
    upstream = {
        "fwd_o": {"g": ("local_cumsum", "g_cumsum"), "A": ("fwd_intra", "A"), "h": ("fwd_h", "h")},
        "bwd_dv": {"A": ("fwd_intra", "A"), "dh": ("bwd_dh", "dh")},
        "bwd_dqk_intra": {"dA": ("bwd_dA", "dA")},
        "bwd_dqkg": {"h": ("fwd_h", "h"), "dh": ("bwd_dh", "dh"), "dq": ("bwd_dqk_intra", "dq")},
    }
    for stage, names in upstream.items():
        f64 = S.stage_inputs_f64(stage_case(op_case, stage), x)
        for n, (src, m) in names.items():
            np.testing.assert_array_equal(f64[n], out[src][m])
    final = {"o": "fwd_o", "dv": "bwd_dv", "dq": "bwd_dqkg", "dk": "bwd_dqkg", "dg": "bwd_dqkg"}
    final.update({"ht": "fwd_h"} if op_case.ht else {})
    final.update({"dh0": "bwd_dh"} if op_case.h0 else {})
    for n, stage in final.items():
        assert rel(out[stage][n], ref[n]) < 1e-12, (n, rel(out[stage][n], ref[n]))


@pytest.mark.parametrize("cid", OP_CASES)
def test_stage_inputs_names_shapes_dtypes(cid):
    """stage_inputs gives stage_input_names (and cu_seqlens int64 for varlen) in the registry's
    shapes and dtypes; q, k, v, do are the op's own bytes; the rest is the float64 value rounded
    once; the oracle's outputs have the registry's shapes; two calls give the same bytes."""
    op_case = Case.from_id(cid)
    for stage in STAGE_ORDER["gla"]:
        check_stage_inputs(stage_case(op_case, stage), S.stage_inputs_f64, OWN)


def test_gate_and_square_inputs():
    """g is float32(chunk-local cumsum of the float64 g / ln 2), restarting at every packed
    sequence; local_cumsum takes the raw g; A and dA are 0 above each row's position in its
    chunk (and mask_undefined keeps exactly the rest)."""
    c = stage_case(Case.from_id(OP_CASES[2]), "fwd_o")
    x = make_inputs(c.op_case)
    g = x["g"][0].astype(np.float64)
    want = np.concatenate([np.cumsum(g[s:e], 0) for s, e in ((0, 37), (37, 38), (38, 100))]) / np.log(2)
    got = stage_inputs(c, x)
    np.testing.assert_allclose(got["g"][0], want.astype(np.float32), rtol=1e-6)
    cs = c.replace(stage="local_cumsum")
    assert stage_inputs(cs, make_inputs(cs.op_case))["g"].tobytes() == x["g"].tobytes()
    pos = chunk_positions(c)
    assert pos[0, 36] == 36 and pos[0, 37] == 0 and pos[0, 38] == 0 and pos[0, 99] == 61
    upper = np.arange(c.chunk_size)[None, None, None, :] > pos[:, :, None, None]
    assert not np.any(np.where(upper, got["A"], 0))
    assert np.all(np.where(upper, True, got["A"] != 0))
    garbage = np.where(upper, np.nan, got["A"])
    np.testing.assert_array_equal(mask_undefined(c, "A", garbage), got["A"])


def test_large_case_is_fast():
    """A T=512, H=4, K=V=128 stage case: inputs and oracle in a few seconds."""
    import time

    c = Case.from_id("gla:bwd_dqkg-fwd-B1-T512-H4-K128-V128-bf16-C64-g_logsig-h0-ht")
    t0 = time.perf_counter()
    stage_oracle(c, stage_inputs(c, make_inputs(c.op_case)))
    assert time.perf_counter() - t0 < 10


def test_fla_stage_functions_agree():
    """FLA 0.6.0's stage functions (Triton interpreter without a GPU, TF32 dots) agree with the oracle to about
    1e-3 relative on a varlen float32 case with two sub-blocks per chunk (A's undefined entries
    masked): the same semantics (a wrong convention, e.g. dg before its reverse cumsum or A
    without the scale, would be off by far more)."""
    op_case = Case.from_id("gla-fwdbwd-B1-T60-H2-K32-V32-fp32-C32-g_stress-h0-ht-lens37_1_22")
    for c, got, ref in fla_stage_runs(op_case):
        for n in c.output_names():
            a = mask_undefined(c, n, got[n])
            assert rel(a, ref[n]) < 5e-3, (c.stage, n, rel(a, ref[n]))
