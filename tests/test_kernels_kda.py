"""kernels_jax.kda.chunk_kda and kernels_jax.gdn.chunk_gdn (Pallas, TPU interpret mode here) against
the float64 oracle, with grouped value heads (HV = G * H), and against each other.

Inputs come from the case registry, tolerances from parity.measure.tol through parity.measure.compare; every
forward output and every gradient must pass. Shapes are small: compiling an interpret-mode
kernel dominates the time, so tests reuse a few shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cases import Case, make_inputs
from kernels_jax.common.platform import compile_for_tpu
from kernels_jax.gdn import chunk_gdn
from kernels_jax.kda import chunk_kda
from parity.execute.backends.calling import run_jax
from tests.helpers import assert_matches_oracle

KERNELS = {
    # FLA's chunk_kda and chunk_gated_delta_rule, one kernel per stage
    "kda": tuple(
        f"kda_chunk_{s}" for s in ("fwd_intra", "fwd_h", "fwd_o", "bwd_dAv", "bwd_dhu", "bwd_wy", "bwd_intra")
    ),
    "gdn": tuple(
        f"gdn_chunk_{s}" for s in ("fwd_intra", "fwd_h", "fwd_o", "bwd_dv_local", "bwd_dhu", "bwd_dqkwg", "bwd_wy")
    ),
}

CASES = [
    # batch 2, T not a multiple of the chunk, chunk 128 with a per-channel decay whose sum over a
    # chunk is far past exp's float32 range (masked-exp-overflow)
    "kda-fwdbwd-B2-T100-H2-K64-V64-fp32-C128-g_stress-h0-ht",
    # packed sequences with unaligned boundaries and a length-1 sequence, K 128 and V 256 (two V
    # tiles in both recurrences, wide-tile-overwrite), bf16
    "kda-fwdbwd-B1-T130-H1-K128-V256-bf16-C64-g_logsig-h0-ht-lens45_1_84",
    # chunk 16 (one sub-block per chunk), forward only
    "kda-fwd-B1-T40-H1-K64-V64-fp32-C16-g_logsig-h0-ht",
    # grouped value heads: 2 q, k heads read by 4 value heads each (HV = 8), bf16, batch 2
    "kda-fwdbwd-B2-T40-H2-K32-V16-bf16-C32-g_logsig-HV8-h0-ht",
    # gdn: 3 value heads on one q, k head, head dims off the tiles, packed with a length-1 sequence
    "gdn-fwdbwd-B1-T50-H1-K20-V24-fp32-C16-g_stress-HV3-h0-ht-lens20_1_29",
]
ENTRY = {"kda": chunk_kda, "gdn": chunk_gdn}


@pytest.mark.parametrize("case_id", CASES)
def test_matches_oracle(case_id):
    case = Case.from_id(case_id)
    tensors, _ = run_jax(ENTRY[case.op], case, make_inputs(case))
    assert_matches_oracle(case, tensors)


def test_gdn_agrees_with_kda_on_repeated_q_k_with_the_gate_broadcast():
    """chunk_gdn with HV = 2 H (value head j reads q, k head j // 2 through its kernels' index maps)
    agrees with chunk_kda, kernels written apart (FLA's two splits of the delta rule), on q, k
    repeated per value head and g broadcast over K by hand: dq, dk are the sums over each group, dg
    the sum over K."""
    case = Case.from_id("gdn-fwdbwd-B1-T40-H2-K16-V16-fp32-C16-g_logsig-HV4-h0-ht")
    x = make_inputs(case)
    flat = case.replace(op="kda", H=4, HV=None)
    x_flat = dict(x, q=np.repeat(x["q"], 2, axis=2), k=np.repeat(x["k"], 2, axis=2))
    x_flat["g"] = np.ascontiguousarray(np.broadcast_to(x["g"][..., None], x["g"].shape + (16,)))
    got, _ = run_jax(chunk_gdn, case, x)
    ref, _ = run_jax(chunk_kda, flat, x_flat)
    ref["dq"], ref["dk"] = (ref[n].reshape(1, 40, 2, 2, 16).sum(3) for n in ("dq", "dk"))
    ref["dg"] = ref["dg"].sum(-1)
    for n in ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"):
        np.testing.assert_allclose(got[n], ref[n], rtol=1e-5, atol=1e-6, err_msg=n)


def _packed_call(inputs, cu_seqlens, chunk_size):
    """o, ht and the vjp of chunk_kda on a case's numpy inputs, with cotangents do, dht."""
    args = [jnp.asarray(inputs[n]) for n in ("q", "k", "v", "g", "beta", "initial_state")]

    def f(q, k, v, g, beta, h0):
        return chunk_kda(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens, chunk_size=chunk_size
        )

    (o, ht), vjp = jax.vjp(f, *args)
    grads = vjp((jnp.asarray(inputs["do"]), jnp.asarray(inputs["dht"])))
    return np.asarray(o), np.asarray(ht), [np.asarray(x) for x in grads]


def test_varlen_state_does_not_leak():
    """Changing every input of sequence 0 leaves sequence 1's outputs, final state and gradients
    bit-identical: the state resets at the (unaligned) boundary in both directions."""
    case = Case.from_id(CASES[1])
    inputs = make_inputs(case)
    cu = jnp.asarray(case.cu_seqlens, jnp.int32)
    first, rest = slice(0, case.seqlens[0]), slice(case.seqlens[0], case.T)
    changed = {n: a.copy() for n, a in inputs.items()}
    rng = np.random.default_rng(1)
    for n in ("q", "k", "v", "g", "beta", "do"):
        changed[n][:, first] = (
            inputs[n][:, first].astype(np.float32) * rng.uniform(0.5, 1.5, inputs[n][:, first].shape)
        ).astype(inputs[n].dtype)
    changed["initial_state"][0] += 1.0
    changed["dht"][0] += 1.0
    o, ht, grads = _packed_call(inputs, cu, case.chunk_size)
    o2, ht2, grads2 = _packed_call(changed, cu, case.chunk_size)
    assert not np.array_equal(o[:, first], o2[:, first])
    np.testing.assert_array_equal(o[:, rest], o2[:, rest])
    np.testing.assert_array_equal(ht[1:], ht2[1:])
    for a, b in zip(grads[:5], grads2[:5]):  # dq, dk, dv, dg, dbeta
        assert not np.array_equal(a[:, first], b[:, first])
        np.testing.assert_array_equal(a[:, rest], b[:, rest])
    np.testing.assert_array_equal(grads[5][1:], grads2[5][1:])  # dh0


def test_traced_cu_seqlens_matches_concrete():
    """Under jit cu_seqlens is a tracer: the chunk count is then a static bound (extra all-padding
    chunks); the result must equal the one with known boundaries."""
    case = Case.from_id(CASES[1])
    inputs = make_inputs(case)
    args = [jnp.asarray(inputs[n]) for n in ("q", "k", "v", "g", "beta", "initial_state")]
    cu = jnp.asarray(case.cu_seqlens, jnp.int32)

    @jax.jit
    def traced(q, k, v, g, beta, h0, cu):
        return chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)

    o, ht = traced(*args, cu)
    o_ref, ht_ref, _ = _packed_call(inputs, cu, case.chunk_size)
    np.testing.assert_allclose(np.asarray(o, np.float32), o_ref.astype(np.float32), rtol=0, atol=0)
    np.testing.assert_allclose(np.asarray(ht), ht_ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op, HV", [("kda", 2), ("gdn", 4)])
def test_lowers_for_tpu(op, HV):
    """Forward and backward, varlen with traced cu_seqlens, K 128 / V 256, bf16 (gdn: HV = 2 H
    value heads): every kernel of the op lowers to a Mosaic TPU custom call (none is left in interpret
    mode)."""
    B, T, H, K, V = 1, 100, 2, 128, 256
    q = jnp.zeros((B, T, H, K), jnp.bfloat16)
    v = jnp.zeros((B, T, HV, V), jnp.bfloat16)
    g = jnp.zeros((B, T, HV) if op == "gdn" else (B, T, HV, K))
    beta, h0 = jnp.zeros((B, T, HV)), jnp.zeros((2, HV, K, V))

    def fwd_bwd(q, k, v, g, beta, h0, cu):
        f = lambda q, k, v, g, beta, h0: ENTRY[op](
            q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu
        )
        outs, vjp = jax.vjp(f, q, k, v, g, beta, h0)
        return outs, vjp(outs)

    with compile_for_tpu():
        exported = jax.export.export(jax.jit(fwd_bwd), platforms=["tpu"])(
            q, q, v, g, beta, h0, jnp.array([0, 37, 100], jnp.int32)
        )
    text = exported.mlir_module()
    assert text.count("tpu_custom_call") == len(KERNELS[op])
    for kernel in KERNELS[op]:
        assert f'"{kernel}' in text, kernel
