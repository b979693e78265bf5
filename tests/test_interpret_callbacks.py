"""TPU interpret mode's callbacks without the jax Array round trip (parity.execute.interpret_callbacks):
the same bits as jax's own io_callback, out-of-bounds reads still raise, other callbacks untouched."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import callback as jax_callback
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from cases import Case, make_inputs
from parity.execute import interpret_callbacks
from parity.execute.backends.calling import run_jax
from parity.execute.backends.jax_backends import PallasBackend

CASE = Case.from_id("gla-fwdbwd-B1-T80-H2-K64-V64-fp32-C32-g_logsig-h0-ht")


@pytest.fixture
def fast_path_calls(monkeypatch):
    """The installed fast path, counting the callbacks it takes."""
    interpret_callbacks.install()
    assert interpret_callbacks.installed()
    calls = []
    original = interpret_callbacks.is_interpreters
    monkeypatch.setattr(interpret_callbacks, "is_interpreters", lambda cb: calls.append(original(cb)) or calls[-1])
    return calls


def test_a_kernel_gets_the_same_bits_as_through_jax_arrays(fast_path_calls, monkeypatch):
    fn, inputs = PallasBackend("pallas").kernel(CASE), make_inputs(CASE)
    fast, _ = run_jax(fn, CASE, inputs)
    assert sum(fast_path_calls) > 100  # every load, store and DMA of the kernels took it
    monkeypatch.setattr(jax_callback, "io_callback_impl", jax_callback.io_callback_impl.__wrapped__)
    slow, _ = run_jax(fn, CASE, inputs)  # the same compiled programs: the callbacks look the impl up per call
    assert sorted(fast) == sorted(slow) and len(fast) == 7
    for name in fast:
        assert np.array_equal(fast[name], slow[name], equal_nan=True), name


def test_an_out_of_bounds_block_still_raises(fast_path_calls):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    beyond = pl.pallas_call(
        kernel,
        grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i + 1, 0))],  # block 2 of a 2-block input
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        interpret=pltpu.InterpretParams(),
    )
    with pytest.raises(Exception, match="[Oo]ut-of-bounds"):
        jax.block_until_ready(beyond(jnp.ones((16, 128), jnp.float32)))
    pltpu.reset_tpu_interpret_mode_state()
    assert any(fast_path_calls)


def test_a_users_own_io_callback_still_gets_jax_arrays(fast_path_calls):
    seen = []

    def host(x):
        seen.append(type(x))
        return np.asarray(x) + 1

    out = jax.jit(lambda x: io_callback(host, jax.ShapeDtypeStruct((3,), jnp.float32), x))(jnp.zeros(3))
    assert np.array_equal(out, np.ones(3)) and seen and all(issubclass(t, jax.Array) for t in seen)
    assert fast_path_calls and not any(fast_path_calls)
