"""The TPU numerics model (parity.measure.tpu_numerics): float32 dots computed as the TPU's MXU
computes them, checked against independent formulations (numpy on bf16-rounded operands,
float64), inside and outside Pallas kernels, and through the gate."""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from cases import Case
from parity.judge.gate import evaluate, load
from parity.measure import tpu_numerics
from tests.helpers import run

RNG = np.random.default_rng(7)
A = RNG.standard_normal((128, 96)).astype(np.float32)
B = RNG.standard_normal((96, 128)).astype(np.float32)
EXACT = A.astype(np.float64) @ B.astype(np.float64)


def _bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def _rel(x, ref):
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / np.linalg.norm(ref))


def _pallas_dot(precision):
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], precision=precision, preferred_element_type=jnp.float32)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32), interpret=pltpu.InterpretParams()
    )


def _float32_dot(a, b):
    with tpu_numerics.using("float32"):
        return np.asarray(jnp.dot(a, b, precision="highest"))


@pytest.mark.parametrize("where", ["xla", "pallas"])
def test_default_dot_is_the_dot_of_bf16_rounded_operands_bit_for_bit(where):
    with tpu_numerics.using("tpu-mxu-v1"):
        got = np.asarray(jnp.dot(A, B) if where == "xla" else _pallas_dot(None)(A, B))
    assert np.array_equal(got, _float32_dot(_bf16(A), _bf16(B)))
    # and that is a TPU's error, not float32's: ~2e-3 against float64 (a real TPU v4: 2.2e-3)
    assert 1e-3 < _rel(got, EXACT) < 4e-3
    with tpu_numerics.using("float32"):
        assert _rel(jnp.dot(A, B), EXACT) < 1e-6


@pytest.mark.parametrize("where", ["xla", "pallas"])
def test_highest_is_six_passes_within_float32_rounding(where):
    with tpu_numerics.using("tpu-mxu-v1"):
        fn = (
            (lambda a, b: jnp.dot(a, b, precision="highest"))
            if where == "xla"
            else _pallas_dot(jax.lax.Precision.HIGHEST)
        )
        got = np.asarray(fn(A, B))
    assert _rel(got, EXACT) < 3e-7
    # the split is really three bf16 pieces: two pieces (HIGH) are measurably worse
    with tpu_numerics.using("tpu-mxu-v1"):
        high = np.asarray(jnp.dot(A, B, precision="high"))
    assert 1e-6 < _rel(high, EXACT) < 2e-5


DOTS = {  # einsum: (lhs shape, rhs shape, dimension_numbers): plain, batched, transposed, matrix-vector
    "mk,kn->mn": ((64, 96), (96, 80), (((1,), (0,)), ((), ()))),
    "bmk,bkn->bmn": ((3, 16, 40), (3, 40, 24), (((2,), (1,)), ((0,), (0,)))),
    "km,nk->mn": ((40, 32), (24, 40), (((0,), (1,)), ((), ()))),
    "mk,k->m": ((8, 128), (128,), (((1,), (0,)), ((), ()))),
}


@pytest.mark.parametrize("n_passes", [3, 6])
@pytest.mark.parametrize("operands", ["f32,f32", "f32,bf16"])
@pytest.mark.parametrize("dot", list(DOTS))
def test_the_passes_in_one_batched_dot_are_the_per_pass_dots_bit_for_bit(dot, operands, n_passes):
    """emulated_dot computes the passes as one batched dot (a third of the compile time): each
    pass, and their sum in _TERMS' order, are the same bits as one float32 dot per pass."""
    lhs_shape, rhs_shape, dn = DOTS[dot]
    rng = np.random.default_rng(n_passes)
    lhs = rng.standard_normal(lhs_shape).astype(np.float32)
    rhs = rng.standard_normal(rhs_shape).astype(np.float32)
    if operands == "f32,bf16":
        rhs = rhs.astype(jnp.bfloat16)
    kw = dict(dimension_numbers=dn, preferred_element_type=jnp.float32, n_passes=n_passes)
    batched = jax.jit(functools.partial(tpu_numerics.emulated_dot, **kw))(lhs, rhs)
    per_pass = jax.jit(functools.partial(tpu_numerics.per_pass_dot, **kw))(lhs, rhs)
    assert np.array_equal(np.asarray(batched), np.asarray(per_pass))
    # and the passes are really there: HIGHEST's three pieces are measurably better than HIGH's two
    exact = np.einsum(dot, lhs.astype(np.float64), np.asarray(rhs, np.float64))
    assert _rel(batched, exact) < (3e-7 if n_passes == 6 else 2e-5)


def test_bf16_operands_are_exact_and_the_precision_default_is_honoured():
    a16, b16 = A.astype(jnp.bfloat16), B.astype(jnp.bfloat16)
    with tpu_numerics.using("tpu-mxu-v1"):
        got = np.asarray(jnp.dot(a16, b16, preferred_element_type=jnp.float32))
        with jax.default_matmul_precision("highest"):
            highest_by_config = np.asarray(jnp.dot(A, B))
    assert _rel(got, _bf16(A).astype(np.float64) @ _bf16(B)) < 3e-7
    assert _rel(highest_by_config, EXACT) < 3e-7


def test_gradients_keep_the_primal_precision_through_scan():
    def loss(a, precision):
        def step(c, _):
            return c + jnp.dot(a, B, precision=precision).sum(), None

        return jax.lax.scan(step, 0.0, None, length=2)[0]

    exact = 2 * B.astype(np.float64).sum(1)[None, :].repeat(128, 0)
    with tpu_numerics.using("tpu-mxu-v1"):
        g_default = np.asarray(jax.grad(loss)(A, None))
        g_highest = np.asarray(jax.grad(loss)(A, jax.lax.Precision.HIGHEST))
    assert _rel(g_default, exact) > 1e-4  # the transposed dot rounds its operands too
    assert _rel(g_highest, exact) < 1e-6


def test_float64_is_untouched():
    with jax.enable_x64(True), tpu_numerics.using("tpu-mxu-v1"):
        got = np.asarray(jnp.dot(A.astype(np.float64), B.astype(np.float64)))
    assert _rel(got, EXACT) < 1e-14


CASES = [
    Case("simple_gla", 1, 128, 2, 128, 128, gate="gamma_alibi", direction="fwd", ht=True),
    Case("simple_gla", 1, 256, 2, 64, 64, gate="g_logsig", direction="fwd", h0=True),
]


@functools.cache
def _gate(tmp, numerics):
    specs = [
        "fla",
        "default=jax:tests.example_candidates:chunked_jax_default",
        "highest=jax:tests.example_candidates:chunked_jax_highest",
    ]
    before = os.environ.get(tpu_numerics.ENV)
    run(CASES, specs, tmp, numerics=numerics)
    # the model is the run's, exported to its workers only: a later run in this process gets its own
    assert os.environ.get(tpu_numerics.ENV) == before
    return evaluate(load([tmp]))


@pytest.mark.parametrize("numerics", ["tpu-mxu-v1", "float32"])
def test_plain_jax_default_einsums_fail_the_bound_under_the_model_only(numerics, tmp_path):
    gate = _gate(tmp_path, numerics)
    verdicts = {(e["case_id"], e["candidate"]): e["verdict"] for e in gate["cases"]}
    for case in CASES:
        assert verdicts[(case.id, "highest")] == "pass", gate["failures"]
        # DEFAULT float32 einsums look float32-accurate in interpret mode; as a TPU computes
        # them they are less accurate than FLA's TF32: the bound fails
        assert verdicts[(case.id, "default")] == ("fail-bound" if numerics == "tpu-mxu-v1" else "pass"), gate
    records = [r for r in (tmp_path / "default").glob("*.json")]
    import json

    assert {json.loads(p.read_text())["numerics"] for p in records} == {numerics}


def test_dots_decided_on_the_vector_unit_are_float32_and_only_in_their_kernel():
    """Inside tpu_numerics.deciding, the decided kernel's dots of the decided class are float32
    (the vector unit); the same dot in another kernel stays one bf16 MXU pass."""
    from tests.tpu_candidates import rows_dot

    x = RNG.standard_normal((8, 128)).astype(np.float32)
    y = RNG.standard_normal((1, 128)).astype(np.float32)
    float32 = x.astype(np.float64) @ y.astype(np.float64).T
    mxu = _bf16(x).astype(np.float64) @ _bf16(y).astype(np.float64).T

    def both():
        with pltpu.force_tpu_interpret_mode():
            return np.asarray(rows_dot(1)(x, y)), np.asarray(rows_dot(8)(x, np.repeat(y, 8, 0)))[:, :1]

    with tpu_numerics.using("tpu-mxu-v1"):
        mxu1, mxu8 = both()
        with tpu_numerics.deciding({"rows_dot_1": ["f32x1"]}, "test"):
            assert tpu_numerics.decision() == {"vector_unit": {"rows_dot_1": ["f32x1"]}, "source": "test"}
            vpu1, still8 = both()
        assert tpu_numerics.decision()["vector_unit"] == {}
        again1, _ = both()
    assert _rel(mxu1, mxu) < 1e-6 and _rel(mxu1, float32) > 1e-4  # undecided: an MXU pass
    assert _rel(vpu1, float32) < 1e-6  # decided: float32
    assert np.array_equal(still8, mxu8) and _rel(mxu8, mxu) < 1e-6  # the other kernel is untouched
    assert np.array_equal(again1, mxu1)  # and the decision ends with its block (no cached lowering)
