"""kernels_jax.gla.stages (FLA 0.6.0's stage calling convention, cases/stages/gla.py) against the
float64 stage oracle (references/stages/gla.py) on the same stage inputs, in TPU interpret mode,
called as the harness calls every stage backend (parity.execute.backends.stage_calling); the
forward stages chained against the whole-op kernel (kernels_jax.gla.chunk_gla); and every stage's
Mosaic kernel lowered for TPU from shapes alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from cases import Case, make_inputs
from cases.stages import RCP_LN2, STAGE_ORDER, resolve, stage_dtype, stage_input_names, stage_of, stage_shapes
from kernels_jax.common.platform import compile_for_tpu
from kernels_jax.gla import chunk_gla
from kernels_jax.gla import stages as S
from parity.execute.backends.stage_calling import run_stage_jax, stage_program
from references.stages import stage_inputs, stage_oracle
from tests.stage_helpers import rel

OP_CASES = [
    "B2-T40-H2-K32-V32-fp32-C16-g_logsig-h0-ht",
    # three sequences, boundaries off the chunk grid, two sub-blocks per chunk
    "B1-T70-H2-K32-V16-fp32-C32-g_stress-h0-ht-lens13_1_56",
    "B1-T100-H1-K32-V32-bf16-C32-g_logsig-h0",
]
TOL = {"float32": 2e-6, "bfloat16": 8e-3}  # ||ours - float64|| / ||float64||, by output dtype
CALLS = [(c, s) for c in OP_CASES for s in STAGE_ORDER["gla"]]


@pytest.fixture
def interpret():
    """TPU interpret mode (the Pallas kernels run on this CPU)."""
    with pltpu.force_tpu_interpret_mode():
        yield


@pytest.mark.parametrize("op_id,stage", CALLS, ids=[f"{c}-{s}" for c, s in CALLS])
def test_stage_matches_the_float64_oracle(op_id, stage, interpret):
    """Names, shapes and dtypes as the registry says; values within float32 arithmetic (bf16
    outputs: their rounding) of the oracle on the same inputs."""
    case = Case.from_id(f"gla:{stage}-fwd-{op_id}")
    inputs = stage_inputs(case, make_inputs(case.op_case))
    got, _ = run_stage_jax(_function(case), case, inputs)
    ref = stage_oracle(case, inputs)
    assert list(got) == case.output_names()
    shapes = stage_shapes(case)
    for n, a in got.items():
        dt = stage_dtype(case, n)
        assert a.shape == shapes[n] and a.dtype == jnp.dtype(dt), (n, a.shape, a.dtype)
        assert rel(a, ref[n]) < TOL[dt], (n, rel(a, ref[n]))


def _function(case):
    """kernels_jax's function of the case's stage (its record's kernels_jax)."""
    return resolve(stage_of(case.op, case.stage).kernels_jax)


def test_stages_under_jit(interpret):
    """The harness's stage program (cu_seqlens concrete, closed over) traced under jax.jit."""
    case = Case.from_id(f"gla:bwd_dqkg-fwd-{OP_CASES[1]}")
    inputs = stage_inputs(case, make_inputs(case.op_case))
    program = jax.jit(stage_program(S.chunk_gla_bwd_dqkg, case))
    got = program({n: jnp.asarray(a) for n, a in inputs.items() if n != "cu_seqlens"})
    ref = stage_oracle(case, inputs)
    for n in case.output_names():
        assert rel(got[n], ref[n]) < TOL["float32"], n


def test_forward_stages_chain_to_the_whole_op(interpret):
    """local_cumsum, fwd_h, fwd_intra, fwd_o chained give kernels_jax's chunk_gla (o, ht)."""
    case = Case.from_id("gla-fwd-B1-T70-H2-K32-V16-fp32-C32-g_logsig-h0-ht-lens13_1_56")
    x = {n: jnp.asarray(a) for n, a in make_inputs(case).items()}
    common = dict(cu_seqlens=x["cu_seqlens"], chunk_size=32)
    scale = case.scale_value
    g = S.chunk_local_cumsum(x["g"], scale=RCP_LN2, **common)
    h, ht = S.chunk_fwd_h(k=x["k"], v=x["v"], gk=g, h0=x["initial_state"], output_final_state=True, **common)
    A = S.chunk_gla_fwd_intra_gk(q=x["q"], k=x["k"], g=g, scale=scale, **common)
    o = S.chunk_gla_fwd_o_gk(q=x["q"], v=x["v"], g=g, A=A, h=h, scale=scale, **common)
    o_op, ht_op = chunk_gla(
        x["q"], x["k"], x["v"], x["g"], scale=scale, initial_state=x["initial_state"], output_final_state=True, **common
    )
    assert rel(o, np.asarray(o_op, np.float64)) < 1e-5
    assert rel(ht, np.asarray(ht_op, np.float64)) < 1e-5


def test_an_empty_sequence_passes_its_state_through(interpret):
    """cu_seqlens with an empty sequence (FLA counts no chunk for it): fwd_h and bwd_dh give the
    states of the same call without it, and pass h0 -> ht, dht -> dh0 through for it."""
    rng = np.random.default_rng(0)
    T, H, K, V = 40, 1, 32, 32
    k, q = (jnp.asarray(rng.standard_normal((1, T, H, K)), jnp.float32) for _ in range(2))
    v, do = (jnp.asarray(rng.standard_normal((1, T, H, V)), jnp.float32) for _ in range(2))
    g = S.chunk_local_cumsum(
        jnp.asarray(-rng.uniform(0, 0.2, (1, T, H, K)), jnp.float32), 16, scale=RCP_LN2, cu_seqlens=np.array([0, 13, T])
    )
    s0 = jnp.asarray(rng.standard_normal((3, H, K, V)), jnp.float32)
    with_empty, without = np.array([0, 13, 13, T]), np.array([0, 13, T])
    h_e, ht_e = S.chunk_fwd_h(k, v, gk=g, h0=s0, output_final_state=True, cu_seqlens=with_empty, chunk_size=16)
    h_n, ht_n = S.chunk_fwd_h(
        k, v, gk=g, h0=s0[np.array([0, 2])], output_final_state=True, cu_seqlens=without, chunk_size=16
    )
    np.testing.assert_array_equal(h_e, h_n)
    np.testing.assert_array_equal(ht_e[np.array([0, 2])], ht_n)
    np.testing.assert_array_equal(ht_e[1], s0[1])
    dh_e, dh0_e = S.chunk_bwd_dh(q, k, v, do, s0, s0, 0.2, gk=g, cu_seqlens=with_empty, chunk_size=16)
    dh_n, dh0_n = S.chunk_bwd_dh(
        q, k, v, do, s0[np.array([0, 2])], s0[np.array([0, 2])], 0.2, gk=g, cu_seqlens=without, chunk_size=16
    )
    np.testing.assert_array_equal(dh_e, dh_n)
    np.testing.assert_array_equal(dh0_e[np.array([0, 2])], dh0_n)
    np.testing.assert_array_equal(dh0_e[1], s0[1])


def test_every_stage_lowers_for_tpu():
    """Each Pallas stage traced from shapes alone (bf16, K = V = 256, varlen, chunk 128) holds one
    Mosaic kernel of its own (jax.export for TPU on this machine), the op's kernel of that stage."""
    case = Case.from_id("gla:fwd_h-fwd-B1-T200-H2-K256-V256-bf16-C128-g_logsig-h0-ht-lens70_130")
    for stage in STAGE_ORDER["gla"]:
        if stage == "local_cumsum":
            continue
        c = case.replace(stage=stage)
        shapes = stage_shapes(c)
        structs = {n: jax.ShapeDtypeStruct(shapes[n], jnp.dtype(stage_dtype(c, n))) for n in stage_input_names(c)}
        fn = stage_program(_function(c), c)
        with compile_for_tpu():
            text = jax.export.export(jax.jit(fn), platforms=["tpu"])(structs).mlir_module()
        assert f'"gla_chunk_{stage.lower()}' in text and text.count("tpu_custom_call") == 1, stage
