"""kernels_jax.gla against the float64 oracle (TPU interpret mode on CPU), varlen isolation,
input validation, and the Mosaic lowering of every kernel (jax.export for TPU on this machine).

Each accuracy case compiles its kernels once (interpret mode: a few seconds per
forward+backward), so the cases are few and each covers several features."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cases import Case
from cases.inputs import make_inputs
from kernels_jax.common.platform import compile_for_tpu
from kernels_jax.gla import chunk_gla
from parity.execute.backends.calling import run_jax
from tests.helpers import assert_matches_oracle

VARLEN_ID = "gla-fwdbwd-B1-T130-H1-K64-V64-fp32-C128-g_stress-h0-ht-lens45_1_84"
ACCURACY = [
    # B = 2, T not a multiple of the chunk, initial and final state
    "gla-fwdbwd-B2-T100-H1-K64-V64-fp32-C64-g_logsig-h0-ht",
    # varlen with boundaries off the chunk grid (and a length-1 sequence), chunk 128; the strong
    # gate (|g| ~ 2 per token and channel) makes |cumsum(g)| over the chunk ~ 256 > 88.7, so exp
    # of any unmasked positive difference overflows float32 (masked-exp-overflow, per channel)
    VARLEN_ID,
    # K = V = 256, chunk 16, bf16
    "gla-fwdbwd-B1-T48-H1-K256-V256-bf16-C16-g_stress-h0-ht",
    # chunk 32, K = V = 128, forward only
    "gla-fwd-B1-T40-H1-K128-V128-fp32-C32-g_logsig-h0-ht",
]


@pytest.mark.parametrize("case_id", ACCURACY)
def test_matches_float64_oracle_within_tol(case_id):
    case = Case.from_id(case_id)
    inputs = make_inputs(case)
    got, _ = run_jax(chunk_gla, case, inputs)
    assert_matches_oracle(case, got)
    # dtypes of FLA's convention: o and dq, dk, dv in the input dtype, states and dg float32
    assert got["o"].dtype == inputs["q"].dtype
    if case.backward:
        assert got["dq"].dtype == inputs["q"].dtype and got["dg"].dtype == np.float32
    if case.ht:
        assert got["ht"].dtype == np.float32


def test_packed_equals_separate_sequences_and_empty_sequence_keeps_h0():
    """packed-state-leak: each packed sequence equals that sequence run alone; an empty sequence's
    final state is its initial state."""
    case = Case.from_id("gla-fwd-B1-T80-H1-K64-V64-fp32-C64-g_logsig-h0-ht-lens40_40")
    x = {n: jnp.asarray(a) for n, a in make_inputs(case).items()}
    cu = np.array([0, 40, 40, 80])
    h0 = jnp.concatenate([x["initial_state"][:1], 3.0 + x["initial_state"][:1], x["initial_state"][1:]])
    o, ht = chunk_gla(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=jnp.asarray(cu, jnp.int32),
        chunk_size=64,
    )
    assert ht.shape == (3, 1, 64, 64)
    np.testing.assert_array_equal(np.asarray(ht[1]), np.asarray(h0[1]))
    for n in (0, 2):
        s = slice(cu[n], cu[n + 1])
        o1, ht1 = chunk_gla(
            x["q"][:, s],
            x["k"][:, s],
            x["v"][:, s],
            x["g"][:, s],
            initial_state=h0[n : n + 1],
            output_final_state=True,
            chunk_size=64,
        )
        np.testing.assert_allclose(np.asarray(o[:, s]), np.asarray(o1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(ht[n]), np.asarray(ht1[0]), rtol=1e-5, atol=1e-5)


def test_no_state_or_gradient_crosses_a_sequence_boundary():
    """Changing every input of sequence 0 (tokens 0..44) leaves the outputs and gradients of
    the later sequences unchanged, bit for bit."""
    case = Case.from_id(VARLEN_ID)
    inputs = make_inputs(case)
    got, _ = run_jax(chunk_gla, case, inputs)
    changed = dict(inputs)
    for n in ("q", "k", "v", "g"):
        changed[n] = inputs[n].copy()
        changed[n][:, :45] = 2 * inputs[n][:, :45] - 0.5
    changed["initial_state"] = inputs["initial_state"].copy()
    changed["initial_state"][0] = 7.0
    got2, _ = run_jax(chunk_gla, case, changed)
    assert not np.allclose(got["o"][:, :45], got2["o"][:, :45])
    for name in ("o", "dq", "dk", "dv", "dg"):
        np.testing.assert_array_equal(got[name][:, 45:], got2[name][:, 45:], err_msg=name)
    for name in ("ht", "dh0"):
        np.testing.assert_array_equal(got[name][1:], got2[name][1:], err_msg=name)


# ------------------------------------------------------------------------------------------------
# Mosaic lowering: every stage kernel of the forward and of the forward and backward lowers for TPU

FORWARD = ("fwd_h", "fwd_intra", "fwd_o")  # FLA's chunk_gla_fwd, one kernel per stage
BACKWARD = ("bwd_dh", "bwd_dv", "bwd_da", "bwd_dqk_intra", "bwd_dqkg")  # and its chunk_gla_bwd
LOWERING = [
    # (K, V, chunk, dtype, varlen)
    (256, 256, 128, jnp.bfloat16, True),
    (64, 128, 16, jnp.float32, False),
]


@pytest.mark.parametrize("K,V,chunk,dtype,varlen", LOWERING)
def test_kernels_lower_for_tpu(K, V, chunk, dtype, varlen):
    T, H = 200, 2
    q = jnp.zeros((1, T, H, K), dtype)
    v = jnp.zeros((1, T, H, V), dtype)
    g = jnp.zeros((1, T, H, K), jnp.float32)
    cu = jnp.array([0, 70, 200], jnp.int32) if varlen else None
    h0 = jnp.zeros((2 if varlen else 1, H, K, V), jnp.float32)

    def fwd(q, k, v, g, h0):
        return chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu, chunk_size=chunk)

    def fwdbwd(q, k, v, g, h0):
        (o, ht), vjp = jax.vjp(fwd, q, k, v, g, h0)
        return vjp((o, ht))

    with compile_for_tpu():
        texts = [jax.export.export(jax.jit(f), platforms=["tpu"])(q, q, v, g, h0).mlir_module() for f in (fwd, fwdbwd)]
    for text, stages in zip(texts, (FORWARD, FORWARD + BACKWARD)):
        assert text.count("tpu_custom_call") == len(stages)
        assert all(f'"gla_chunk_{stage}' in text for stage in stages), stages
