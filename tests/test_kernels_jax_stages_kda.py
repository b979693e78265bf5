"""kernels_jax.kda.stages (FLA 0.6.0's KDA stage calling convention, cases/stages/kda.py) against
the float64 stage oracle (references/stages/kda.py) on the same stage inputs, in TPU interpret
mode; called as every backend calls a stage (parity.execute.backends.stage_calling), eagerly and
under jax.jit; and each stage traced as one Mosaic TPU kernel (local_cumsum: none, XLA).
"""

from __future__ import annotations

import jax
import pytest
from jax.experimental.pallas import tpu as pltpu

from cases import Case, make_inputs
from cases.stages import STAGE_ORDER, resolve, stage_of
from kernels_jax.common.platform import compile_for_tpu
from parity.execute.backends.stage_calling import run_stage_jax, stage_program, stage_structs
from references.stages import stage_inputs, stage_oracle
from tests.stage_helpers import rel

# op case -> max relative error (||ours - oracle|| / ||oracle||) per output; float32 arithmetic
# measures ~1e-7; bfloat16 outputs round to ~2e-3
CASES = {
    "kda-fwdbwd-B2-T100-H2-K32-V16-fp32-C32-g_logsig-h0-ht": 1e-5,
    "kda-fwdbwd-B1-T100-H1-K16-V24-fp32-C32-g_stress-HV2-h0-ht-lens37_1_62": 1e-5,
    "kda-fwdbwd-B2-T70-H2-K32-V32-bf16-C64-g_stress-ht": 1e-2,
}


@pytest.fixture
def interpret():
    """TPU interpret mode (the Pallas kernels run on this CPU)."""
    with pltpu.force_tpu_interpret_mode():
        yield


def _stage(cid: str, stage: str):
    """(stage case, its stage inputs, the oracle's outputs, our stage function)."""
    c = Case.from_id(cid).replace(stage=stage, direction="fwd")
    inputs = stage_inputs(c, make_inputs(c.op_case))
    return c, inputs, stage_oracle(c, inputs), resolve(stage_of("kda", stage).kernels_jax)


@pytest.mark.parametrize("cid", CASES)
def test_stages_match_the_oracle(interpret, cid):
    """Every stage, called as a backend calls it: the outputs FLA returns, in FLA's shapes and
    dtypes, within the case's bound of the float64 oracle."""
    for stage in STAGE_ORDER["kda"]:
        c, inputs, ref, fn = _stage(cid, stage)
        got, _ = run_stage_jax(fn, c, inputs)
        assert list(got) == c.output_names(), stage
        for n in c.output_names():
            assert got[n].shape == ref[n].shape, (stage, n)
            err = rel(got[n], ref[n])
            assert err < CASES[cid], (stage, n, err)


def test_stages_under_jit(interpret):
    """The varlen grouped case's stages traced under jax.jit (cu_seqlens closed over) give the
    eager results."""
    cid = list(CASES)[1]
    for stage in ("fwd_intra", "fwd_h", "bwd_dhu", "bwd_wy", "bwd_intra"):
        c, inputs, ref, fn = _stage(cid, stage)
        program = jax.jit(stage_program(fn, c))
        got = program({n: inputs[n] for n in stage_structs(c)})
        for n in c.output_names():
            assert rel(got[n], ref[n]) < 1e-5, (stage, n)


def test_fwd_intra_returns_fla_tuple(interpret):
    """chunk_kda_fwd_intra returns FLA's six (w, u, qg None, kg, Aqk, Akk) in k's dtype (u in
    v's); fwd_h's ht is None without output_final_state; bwd_dhu's dh0 None without h0."""
    c, inputs, _, fn = _stage(list(CASES)[2], "fwd_intra")
    x = {n: jax.numpy.asarray(a) for n, a in inputs.items()}
    out = fn(**x, scale=c.scale_value, chunk_size=c.chunk_size)
    assert len(out) == 6 and out[2] is None
    assert all(out[i].dtype == jax.numpy.bfloat16 for i in (0, 1, 3, 4, 5))
    c, inputs, _, fn = _stage(list(CASES)[2], "fwd_h")
    x = {n: jax.numpy.asarray(a) for n, a in inputs.items()}
    h, v_new, ht = fn(**x, chunk_size=c.chunk_size)
    assert ht is None and h.dtype == v_new.dtype == jax.numpy.bfloat16
    c, inputs, _, fn = _stage(list(CASES)[2], "bwd_dhu")
    x = {n: jax.numpy.asarray(a) for n, a in inputs.items()}
    dh, dh0, dv = fn(**x, scale=c.scale_value, chunk_size=c.chunk_size)
    assert dh0 is None and dh.dtype == dv.dtype == jax.numpy.bfloat16


def test_each_stage_is_its_tpu_kernels():
    """Traced for TPU (compile_for_tpu), each stage is one Mosaic kernel named after it (the op's
    kernel of that stage); local_cumsum none (plain XLA)."""
    cid = list(CASES)[1]
    for stage in STAGE_ORDER["kda"]:
        c, inputs, _, fn = _stage(cid, stage)
        with compile_for_tpu():
            text = jax.export.export(jax.jit(stage_program(fn, c)), platforms=["tpu"])(stage_structs(c)).mlir_module()
        kernels = 0 if stage == "local_cumsum" else 1
        assert text.count("tpu_custom_call") == kernels, stage
        if kernels:
            assert f'"kda_chunk_{stage}' in text, stage
