"""Planted user candidates for the TPU compile check (tests only).

`bf16_fp32_contract`, `interpret_left_on`: kernels_jax's Simple GLA from the copy of kernels_jax
with that mutant's bug planted (parity.mutants.patched), as a user's Pallas kernel with that bug
would be.

`sign_1d`, `tpu_info_block`: production-style Pallas TPU kernels that ask the TPU who it is
(forward cases only). Both return Simple GLA's output multiplied by 1.0 that a small Pallas
kernel of their own computed, so they pass where chunk_simple_gla passes:
    sign_1d         jnp.sign on 1-D blocks: Mosaic's own lowering of both asks
                    get_tpu_info() for the default device while compiling
    tpu_info_block  reads pltpu.get_tpu_info() at trace time to choose its block (the MXU's
                    column size: 128 on v5e, 256 on v6e and TPU7x), as tpu-inference's GDN
                    kernels read num_lanes; what it read is appended to SEEN, with whether
                    XLA's optimisations were off while it was traced (interpret mode: on) and
                    whether a compile there could go to jax's persistent compilation cache
                    (a TPU compile: no)
Dots the compiler keeps off the MXU (the TPU numerics model decides from the compile):
    rows_dot(n)     a Pallas kernel named f"rows_dot_{n}": x [M, K] against n rows y [n, K],
                    x @ y.T, float32 at DEFAULT precision. With n = 1 (a matrix times one
                    vector given as a row) Mosaic computes it on the vector unit: no MXU
                    matmul in its module on v5e, v6e, TPU7x (libtpu 0.0.42); with n = 8, one
                    float32 MXU pass
    vpu_dot         Simple GLA times 1.0 computed by rows_dot(1) (forward cases only)
For the compiler's out-of-VMEM messages (also Simple GLA times 1.0):
    vmem_hog        a VMEM scratch of 200 MiB: more than any target's VMEM
    vmem_scoped     blocks of 24 MiB in and 24 MiB out: over XLA's default scoped VMEM limit
                    on v6e (32 MiB) but within its VMEM (128 MiB); double-buffered (96 MiB)
                    more than TPU7x's VMEM (64 MiB)
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.simple_gla import chunk_simple_gla
from parity.execute import compile_log
from parity.mutants import BY_NAME
from parity.mutants.patched import patched_module

SEEN: list[dict] = []  # what tpu_info_block read at trace time, in this process


def bf16_fp32_contract(q, k, v, **kw):
    """bf16 x bf16 matmuls asking for float32 contract precision: Mosaic rejects them."""
    return patched_module(BY_NAME["bf16-dot-fp32-contract"], "kernels_jax.simple_gla").chunk_simple_gla(q, k, v, **kw)


def interpret_left_on(q, k, v, **kw):
    """interpret mode hard-coded on: its TPU module holds no Mosaic kernel."""
    return patched_module(BY_NAME["interpret-left-on"], "kernels_jax.simple_gla").chunk_simple_gla(q, k, v, **kw)


def _forward_only(case):
    return True if not case.backward else "forward only (no VJP for its Pallas kernels)"


def _ones_1d(x):
    """1.0 from a Pallas kernel: sign(|x| + 1) over x flattened, in 1-D blocks of 1024."""
    flat = jnp.abs(x.reshape(-1).astype(jnp.float32)) + 1.0
    flat = jnp.pad(flat, (0, -flat.shape[0] % 1024), constant_values=1.0)
    spec = pl.BlockSpec((1024,), lambda i: (i,))

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sign(x_ref[...])

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(flat.shape, flat.dtype),
        grid=(flat.shape[0] // 1024,),
        in_specs=[spec],
        out_specs=spec,
        name="sign_1d",
    )(flat)
    return jnp.min(out)


def sign_1d(q, k, v, **kw):
    o, ht = chunk_simple_gla(q, k, v, **kw)
    return o * _ones_1d(q).astype(o.dtype), ht


sign_1d.supports = _forward_only


def tpu_info_block(q, k, v, **kw):
    info = pltpu.get_tpu_info()
    block = info.mxu_column_size
    seen = {"chip_version": str(info.chip_version), "num_lanes": info.num_lanes, "block": block}
    SEEN.append(
        {
            **seen,
            "is_tpu_device": pltpu.is_tpu_device(),
            "optimisations_off": compile_log.read_flag("jax_disable_most_optimizations"),
            "cache_writes": compile_log.read_flag("jax_persistent_cache_min_compile_time_secs")
            < compile_log.NEVER_CACHED_S,
        }
    )
    spec = pl.BlockSpec((8, block), lambda i: (0, i))

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    ones = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8, 512), jnp.float32),
        grid=(512 // block,),
        in_specs=[spec],
        out_specs=spec,
        name="tpu_info_block",
    )(jnp.zeros((8, 512), jnp.float32))
    o, ht = chunk_simple_gla(q, k, v, **kw)
    return o * jnp.min(ones).astype(o.dtype), ht


tpu_info_block.supports = _forward_only


def _times_one(o, x, **pallas_kw):
    """o * 1.0, the 1.0 from a Pallas kernel over x (x + 1 with x zeros), kept in the program."""

    def kernel(x_ref, o_ref, *scratch):
        o_ref[...] = x_ref[...] + 1.0

    ones = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), **pallas_kw)(x)
    return o * jnp.min(ones).astype(o.dtype)


def vmem_hog(q, k, v, **kw):
    o, ht = chunk_simple_gla(q, k, v, **kw)
    x = jnp.zeros((8, 512), jnp.float32)
    return _times_one(o, x, scratch_shapes=[pltpu.VMEM((102400, 512), jnp.float32)], name="vmem_hog"), ht


def vmem_scoped(q, k, v, **kw):
    o, ht = chunk_simple_gla(q, k, v, **kw)
    spec = pl.BlockSpec((6144, 1024), lambda i: (i, 0))
    x = jnp.zeros((12288, 1024), jnp.float32)
    return _times_one(o, x, grid=(2,), in_specs=[spec], out_specs=spec, name="vmem_scoped"), ht


vmem_hog.supports = vmem_scoped.supports = _forward_only


def rows_dot(n: int):
    """fn(x [M, K] f32, y [n, K] f32) -> x @ y.T [M, n]: one Pallas kernel, `rows_dot_{n}`."""

    def kernel(x_ref, y_ref, o_ref):
        dims = (((1,), (1,)), ((), ()))
        o_ref[...] = jax.lax.dot_general(x_ref[...], y_ref[...], dims, preferred_element_type=jnp.float32)

    def fn(x, y):
        out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
        return pl.pallas_call(kernel, out_shape=out, name=f"rows_dot_{n}")(x, y)

    return fn


def vpu_dot(q, k, v, **kw):
    o, ht = chunk_simple_gla(q, k, v, **kw)
    one = rows_dot(1)(jnp.ones((8, 128), jnp.float32), jnp.full((1, 128), 1 / 128, jnp.float32))
    return o * jnp.min(one).astype(o.dtype), ht


vpu_dot.supports = _forward_only
