"""Where the Pallas kernels run: compiled by Mosaic on a TPU, TPU interpret mode elsewhere.

No kernel hard-codes interpret mode on: every `pl.pallas_call` passes
`interpret=interpret_mode()`, which is False on a TPU and TPU interpret mode
(`pltpu.InterpretParams`) on any other platform, so the same kernel code is
checked on CPU and compiled on TPU.
"""

from __future__ import annotations

import contextlib

import jax
from jax.experimental.pallas import tpu as pltpu


def on_tpu() -> bool:
    """Whether jax runs on a TPU (asked at every call, as a kernel library asks: a harness that
    emulates a TPU host answers yes while it does)."""
    try:
        return any(d.platform == "tpu" for d in jax.devices())
    except RuntimeError:
        return False


_compile_for_tpu = False


@contextlib.contextmanager
def compile_for_tpu():
    """Trace kernels as Mosaic TPU kernels even on a CPU machine (to compile them for TPU
    targets). The choice is made at trace time and jax's trace caches do not key on it, so
    the caches are cleared on entering and leaving (no interpret-mode trace is reused for a
    TPU compile, nor the reverse)."""
    global _compile_for_tpu
    prev, _compile_for_tpu = _compile_for_tpu, True
    jax.clear_caches()
    try:
        yield
    finally:
        _compile_for_tpu = prev
        jax.clear_caches()


def interpret_mode():
    """The `interpret=` argument for pl.pallas_call (read at trace time): False on TPU or
    inside compile_for_tpu(), TPU interpret mode elsewhere."""
    return False if (on_tpu() or _compile_for_tpu) else pltpu.InterpretParams()


def platform_name() -> str:
    """Where the kernels really run, e.g. 'tpu:TPU v5 lite' or 'cpu:tpu-interpret'."""
    if on_tpu():
        return "tpu:" + jax.devices("tpu")[0].device_kind
    return f"{jax.default_backend()}:tpu-interpret"
