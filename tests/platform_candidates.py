"""Planted kernel libraries that choose their path by asking jax where they are, as public Pallas
TPU libraries do (tests only; imported by the harness from a `--candidate` spec, never by a test
module, so that the harness's import is the first).

Each returns Simple GLA's (o, ht), forward cases only: kernels_jax's chunk_simple_gla times the 1.0
that a small Pallas kernel `ones` computes, with the `interpret` the library chooses:
    asks_default_backend   interpret = jax.default_backend() != "tpu" at each call (atomic-ops)
    asks_at_import         the same, fixed when the module is imported (a config default)
    falls_back             jax.devices("tpu") raising -> a plain-XLA recurrence (gdn2-pallas);
                           else the Pallas path
    interpret_true         interpret=True hard-coded: Pallas's generic interpreter, on a TPU too
    xla_only               the plain-XLA recurrence alone: no Pallas kernel at all
    asks_device_kind       reads jax.devices()[0].device_kind and num_cores (as jax's
                           ragged_paged_attention chooses its blocks) into SEEN
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_jax.simple_gla import chunk_simple_gla

INTERPRET_AT_IMPORT = jax.default_backend() != "tpu"
SEEN: list[dict] = []


def _forward_only(case):
    return True if not case.backward else "forward only"


def _ones(interpret) -> jax.Array:
    """1.0 from a Pallas kernel named `ones`."""

    def ones(o_ref):
        o_ref[...] = jnp.ones_like(o_ref)

    out = pl.pallas_call(ones, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), interpret=interpret, name="ones")
    return jnp.min(out())


def _pallas(interpret, q, k, v, **kw):
    o, ht = chunk_simple_gla(q, k, v, **kw)
    return (o * _ones(interpret)).astype(o.dtype), ht


def _xla(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, **_):
    """Simple GLA as a plain-XLA scan over tokens: S = exp(g_t) S + k_t^T v_t, o_t = scale q_t S."""
    B, T, H, K = q.shape
    scale = K**-0.5 if scale is None else scale
    S0 = jnp.zeros((B, H, K, v.shape[-1]), jnp.float32) if initial_state is None else initial_state
    f32 = lambda x: jnp.moveaxis(x.astype(jnp.float32), 1, 0)  # noqa: E731

    def step(S, x):
        qt, kt, vt, gt = x
        S = jnp.exp(gt)[..., None, None] * S + kt[..., :, None] * vt[..., None, :]
        return S, scale * jnp.einsum("bhk,bhkv->bhv", qt, S)

    ht, o = jax.lax.scan(step, S0, (f32(q), f32(k), f32(v), f32(g)))
    return jnp.moveaxis(o, 0, 1).astype(v.dtype), (ht if output_final_state else None)


def asks_default_backend(q, k, v, **kw):
    return _pallas(jax.default_backend() != "tpu", q, k, v, **kw)


def asks_at_import(q, k, v, **kw):
    return _pallas(INTERPRET_AT_IMPORT, q, k, v, **kw)


def falls_back(q, k, v, **kw):
    try:
        jax.devices("tpu")
    except RuntimeError:
        return _xla(q, k, v, **kw)
    return _pallas(False, q, k, v, **kw)


def interpret_true(q, k, v, **kw):
    return _pallas(True, q, k, v, **kw)


def xla_only(q, k, v, **kw):
    return _xla(q, k, v, **kw)


def asks_device_kind(q, k, v, **kw):
    dev = jax.devices()[0]
    SEEN.append({"platform": dev.platform, "device_kind": dev.device_kind, "num_cores": dev.num_cores})
    return _pallas(False, q, k, v, **kw)


for _fn in (asks_default_backend, asks_at_import, falls_back, interpret_true, xla_only, asks_device_kind):
    _fn.supports = _forward_only
