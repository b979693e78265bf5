"""kernels_jax.gdn.stages (FLA 0.6.0's stage calling convention, cases/stages/gdn.py) against the
float64 stage oracle (references/stages/gdn.py) on the same stage inputs, in TPU interpret mode;
the forward stages chained against the whole op (kernels_jax.gdn.chunk_gdn); and every stage
lowered for TPU as one Mosaic kernel.

Each stage is called as the harness calls it (parity.execute.backends.stage_calling: keyword
arguments under FLA's names, cu_seqlens concrete int32, chunk_size, scale, output_final_state).
Tolerance: relative norm error 1e-5 for float32 outputs (float32 arithmetic, HIGHEST-precision
dots; measured <= 7.3e-7), 4e-3 for bfloat16 outputs (their own rounding; measured <= 1.7e-3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from cases import Case, make_inputs
from cases.stages import STAGE_ORDER, resolve, stage_dtype, stage_of, stage_shapes
from kernels_jax.common.platform import compile_for_tpu
from kernels_jax.gdn import chunk_gdn
from kernels_jax.gdn import stages as S
from parity.execute.backends.stage_calling import run_stage_jax, stage_program, stage_structs
from references.stages import stage_inputs, stage_oracle
from tests.stage_helpers import rel

TOL = {"float32": 1e-5, "bfloat16": 4e-3}
# label -> op case
OP_CASES = {
    # rows, B = 2, h0 and ht, chunk 16
    "rows": "gdn-fwdbwd-B2-T40-H2-K32-V16-fp32-C16-g_logsig-h0-ht",
    # packed sequences (one of length 1, boundaries off the chunk grid), grouped value heads, stress gates
    "varlen-gva": "gdn-fwdbwd-B1-T45-H1-K16-V32-fp32-C16-g_stress-h0-ht-HV2-lens20_1_24",
    # bfloat16, chunk 32, final state only
    "bf16": "gdn-fwdbwd-B1-T64-H2-K32-V32-bf16-C32-g_logsig-ht",
}
CALLS = [(label, stage) for label in OP_CASES for stage in STAGE_ORDER["gdn"]]


@pytest.fixture
def interpret():
    """TPU interpret mode (the Pallas kernels run on this CPU)."""
    with pltpu.force_tpu_interpret_mode():
        yield


@pytest.mark.parametrize("label,stage", CALLS, ids=[f"{c}-{s}" for c, s in CALLS])
def test_stage_matches_float64_oracle(label, stage, interpret):
    case = Case.from_id(OP_CASES[label]).replace(stage=stage, direction="fwd")
    inputs = stage_inputs(case, make_inputs(case.op_case))
    fn = resolve(stage_of("gdn", stage).kernels_jax)
    got, _ = run_stage_jax(fn, case, inputs)
    ref = stage_oracle(case, inputs)
    assert list(got) == case.output_names()
    shapes = stage_shapes(case)
    for n, a in got.items():
        want = stage_dtype(case, n)
        assert a.shape == shapes[n] and a.dtype.name == want, (n, a.shape, a.dtype)
        assert rel(a, ref[n]) < TOL[want], (n, rel(a, ref[n]))


def test_stages_under_jit(interpret):
    """The stage functions trace under jax.jit (cu_seqlens concrete, closed over) and give what they
    give eagerly: a varlen chain fwd_intra -> fwd_h -> fwd_o."""
    case = Case.from_id(OP_CASES["varlen-gva"]).replace(direction="fwd")
    x = make_inputs(case)
    cu = np.asarray(x["cu_seqlens"], np.int32)
    g = S.chunk_local_cumsum(jnp.asarray(x["g"]), 16, scale=1 / np.log(2), cu_seqlens=cu)

    def chain(q, k, v, g, beta, h0):
        w, u, A = S.chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, cu_seqlens=cu, chunk_size=16)
        h, v_new, ht = S.chunk_gated_delta_rule_fwd_h(
            k=k, w=w, u=u, g=g, initial_state=h0, output_final_state=True, cu_seqlens=cu, chunk_size=16
        )
        return S.chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=0.25, cu_seqlens=cu, chunk_size=16), ht

    args = [jnp.asarray(x[n]) for n in ("q", "k", "v")] + [g, jnp.asarray(x["beta"]), jnp.asarray(x["initial_state"])]
    eager, jitted = chain(*args), jax.jit(chain)(*args)
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_forward_stages_equal_whole_op(interpret):
    """local_cumsum, fwd_intra, fwd_h, fwd_o chained give kernels_jax's whole-op chunk_gdn (o, ht)."""
    case = Case.from_id(OP_CASES["varlen-gva"]).replace(direction="fwd")
    x = {n: jnp.asarray(a) for n, a in make_inputs(case).items()}
    cu = np.asarray(x["cu_seqlens"], np.int32)
    common = dict(cu_seqlens=cu, chunk_size=16)
    g = S.chunk_local_cumsum(x["g"], scale=1 / np.log(2), **common)
    w, u, _ = S.chunk_gated_delta_rule_fwd_intra(k=x["k"], v=x["v"], g=g, beta=x["beta"], **common)
    h, v_new, ht = S.chunk_gated_delta_rule_fwd_h(
        k=x["k"], w=w, u=u, g=g, initial_state=x["initial_state"], output_final_state=True, **common
    )
    o = S.chunk_fwd_o(q=x["q"], k=x["k"], v=v_new, h=h, g=g, scale=case.scale_value, **common)
    o_op, ht_op = chunk_gdn(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        scale=case.scale_value,
        initial_state=x["initial_state"],
        output_final_state=True,
        **common,
    )
    assert rel(o, np.asarray(o_op, np.float64)) < 1e-5
    assert rel(ht, np.asarray(ht_op, np.float64)) < 1e-5


def test_every_stage_lowers_for_tpu():
    """Each stage traced from shapes alone (bf16, varlen, K = 128, V = 64, grouped heads) holds
    exactly one Mosaic kernel, named after it (local_cumsum: none, a jnp cumsum)."""
    op_case = Case.from_id("gdn-fwdbwd-B1-T200-H1-K128-V64-bf16-C64-g_logsig-h0-ht-HV2-lens70_130")
    for stage in STAGE_ORDER["gdn"]:
        case = op_case.replace(stage=stage, direction="fwd")
        fn = resolve(stage_of("gdn", stage).kernels_jax)
        with compile_for_tpu():
            text = jax.export.export(jax.jit(stage_program(fn, case)), platforms=["tpu"])(
                stage_structs(case)
            ).mlir_module()
        if stage == "local_cumsum":
            assert "tpu_custom_call" not in text
        else:
            assert f'"gdn_chunk_{stage}' in text and text.count("tpu_custom_call") == 1, stage
