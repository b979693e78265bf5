"""TPU interpret mode's own callbacks, called with the numpy arrays XLA hands to the host.

TPU interpret mode (jax.experimental.pallas.tpu.InterpretParams) runs every load, store, DMA and
semaphore of a kernel as a `jax.experimental.io_callback` into its simulated TPU memory, from the
compiled XLA:CPU program. jax's io_callback first turns each numpy argument into a jax Array on
the CPU device (`device_put`) and the interpreter's functions turn them straight back into numpy
(`int(...)`, `np.array(...)`): that round trip was three quarters of a kernel's run once its
program is compiled (simple_gla fwd+bwd, B2 T128 H3 K=V=64, C32: 2.0 s, 0.5 s without it; same
bits). `install` skips it for the callbacks whose function is the interpreter's own (defined in
jax's `pallas.mosaic.interpret` package); every other io_callback, a user's included, still gets
jax Arrays from jax's own implementation. Where jax has no `io_callback_impl` to wrap, nothing
changes (`installed()` is False)."""

from __future__ import annotations

import functools

INTERPRETER_PACKAGE = "jax._src.pallas.mosaic.interpret"

_state = {"installed": False}


def _function(f):
    """The function behind partials (the interpreter passes functools.partial(get, ...))."""
    while isinstance(f, functools.partial):
        f = f.func
    return f


def is_interpreters(callback) -> bool:
    """Whether an io_callback's flat callback (jax's _FlatCallback) calls the TPU interpreter's own function."""
    fn = _function(getattr(callback, "callback_func", None))
    return getattr(fn, "__module__", "").startswith(INTERPRETER_PACKAGE)


def install() -> None:
    """Once per process (see the module docstring)."""
    if _state["installed"]:
        return
    import numpy as np
    from jax._src import callback as jax_callback
    from jax._src import tree_util

    original = getattr(jax_callback, "io_callback_impl", None)
    if original is None:
        return

    @functools.wraps(original)
    def io_callback_impl(*args, callback, **params):
        if is_interpreters(callback):
            return tree_util.tree_map(np.asarray, callback(*args))
        return original(*args, callback=callback, **params)

    jax_callback.io_callback_impl = io_callback_impl
    _state["installed"] = True


def installed() -> bool:
    return _state["installed"]
