"""Which TPU a jax program is told it is on, on a machine without one.

Pallas TPU kernels ask the TPU who it is: `pltpu.get_tpu_info()` (tpu-inference's GDN kernels
read its num_lanes; others choose tiles by generation, VMEM capacity or core count) and
`pltpu.is_tpu_device()`; Mosaic's own lowering asks get_tpu_info() too (jnp.sign, 1-D blocks).
jax answers for the *default device* (jax._src.pallas.mosaic.tpu_info.get_device_kind and
get_num_device_cores), here the CPU: `ValueError: Unsupported TPU device kind: cpu`.

- Compiling for a target (parity.execute.tpu_compile): the target's compile-only device is made
  the default device (`jax.default_device`) while tracing, lowering and compiling, so jax asks
  the target itself; nothing is patched. `tpu_info_for(device)` is get_tpu_info() so asked.
- TPU interpret mode (parity.execute.backends.jax_backends): a compile-only device executes
  nothing, so it cannot be the default. `emulated(target)` answers jax's two questions with the
  target's identity (IDENTITIES: its device kind and cores) while the candidate runs, and puts
  them back on leaving, exception or not; jax's own code builds the TpuInfo from them, as on that
  TPU. The target's name is also a jax user context meanwhile, so that jax's caches keyed on the
  trace context (get_tpu_info's, jit's traces) never serve one identity's answer under another,
  or outside. Not emulated: `jax.devices()` still lists the CPU (its device_kind is "cpu"), the
  kernel computes as interpret mode computes, and the record's platform stays
  `cpu:tpu-interpret`: the identity is emulated, never the TPU. Worker threads other than the
  caller's would see the identity too while it is on (the harness runs one case at a time).

Which target interpret mode emulates: `--tpu-interpret-as`, else the first of the run's
`--tpu-targets`, else the first default target (v5e); the command line hands it to its spawned
workers through the environment (ENV, SOURCE_ENV: `exported`).
"""

from __future__ import annotations

import contextlib
import functools
import os

from parity.model.targets import DEFAULT_TARGETS, IDENTITIES  # IDENTITIES: target -> (device kind, cores)

ENV = "PARITY_TPU_INTERPRET_AS"  # the target TPU interpret mode emulates in this process
SOURCE_ENV = "PARITY_TPU_INTERPRET_AS_SOURCE"  # the option it came from


def interpret_target() -> tuple[str, str]:
    """(target, source) that TPU interpret mode emulates in this process: $PARITY_TPU_INTERPRET_AS
    (set by `parity run` and the pytest plugin), else the first default target."""
    target = os.environ.get(ENV)
    if not target:
        return DEFAULT_TARGETS[0], "default"
    if target not in IDENTITIES:
        raise ValueError(f"${ENV}={target!r}: expected one of {list(IDENTITIES)}")
    return target, os.environ.get(SOURCE_ENV) or f"${ENV}"


def choose(interpret_as: str | None, targets, options=("--tpu-interpret-as", "--tpu-targets")):
    """A run's (target, source): interpret_as, else the first of its TPU targets, else None (the
    default applies); the source is the option's name."""
    if interpret_as:
        return interpret_as, options[0]
    if targets:
        return targets[0], options[1]
    return None


@contextlib.contextmanager
def exported(choice: tuple[str, str] | None):
    """The run's choice in the environment (spawned workers inherit it), restored on leaving."""
    saved = {k: os.environ.get(k) for k in (ENV, SOURCE_ENV)}
    if choice is not None:
        os.environ[ENV], os.environ[SOURCE_ENV] = choice
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def describe(target: str, source: str) -> dict:
    """The record's statement of the identity TPU interpret mode answered with."""
    kind, cores = IDENTITIES[target]
    return {"emulated": target, "device_kind": kind, "num_cores": cores, "source": source}


@functools.cache
def _user_context():
    import jax  # late: jax is heavy (the command line imports this module)

    return jax.make_user_context(None)  # created once: jax adds user contexts non-thread-safely


@contextlib.contextmanager
def emulated(target: str):
    """Inside: jax's Pallas TPU queries (pltpu.get_tpu_info, pltpu.is_tpu_device, Mosaic's own)
    answer as `target` would; restored on leaving, exception or not (module docstring)."""
    from jax._src.pallas.mosaic import tpu_info  # late: jax is heavy; the module jax asks through

    kind, cores = IDENTITIES[target]
    saved = tpu_info.get_device_kind, tpu_info.get_num_device_cores
    with _user_context()(f"parity-tpu-identity:{target}"):
        tpu_info.get_device_kind, tpu_info.get_num_device_cores = (lambda: kind), (lambda: cores)
        try:
            yield
        finally:
            tpu_info.get_device_kind, tpu_info.get_num_device_cores = saved


def tpu_info_for(device):
    """get_tpu_info() as jax answers it with `device` (a compile-only TPU device) the default."""
    import jax  # late: jax is heavy (the command line imports this module)
    from jax.experimental.pallas import tpu as pltpu

    with jax.default_device(device):
        return pltpu.get_tpu_info()
