"""Chunked GLA (per-channel log-decay g) as Pallas TPU kernels, forward and backward.

Recurrence (per sequence and head; S_t [K, V] float32, S_0 = initial_state or 0):
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t,        o_t = scale * q_t S_t
Per chunk of C tokens with gc = chunk-local cumsum(g), S the state at the chunk start:
    o      = scale * (q * exp(gc)) @ S + scale * (A masked to s <= t) @ v     (A: see intra.py)
    S_next = exp(gc_last)^T * S + (k * exp(gc_last - gc))^T @ v
Kernels (grid over heads and chunks, chunks sequential, the state in VMEM scratch):
    forward:  grid (H, V / BV, NT), o, the final states and (for backward) the state at
              every chunk start;
    backward: grid (H, NT) in reverse, the state gradient carried backwards, dq, dk, dv,
              dg and the initial-state gradient.
Shapes (FLA layout): q, k, g [B, T, H, K]; v [B, T, H, V]; states [N, H, K, V] float32.
"""
from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common import validation
from kernels_jax.common.mutation import active
from kernels_jax.common.platform import interpret_mode

from . import intra
from .layout import Layout, dense_layout, varlen_layout

CHUNK_SIZES = (16, 32, 64, 128)
HEAD_DIMS = (16, 32, 64, 128, 256)
INPUT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
MAX_V_TILE = 128
SEGMENT = 64        # backward: the gate gradient of longer chunks goes through the state every 64 rows


# ---------------------------------------------------------------- kernels
def _load(ref, rows=None):
    return (ref[...] if rows is None else ref[rows, :]).astype(jnp.float32)


def _fwd_kernel(seq_ref, first_ref, last_ref, q_ref, k_ref, v_ref, g_ref, h0_ref,
                o_ref, ht_ref, *rest, scale, save_states):
    """One (head, V tile, chunk): q, k, g [C, K]; v, o [C, BV]; h0, ht, hs [K, BV].
    Scratch: state [K, BV]; loc [C, K] (block-local cumsum of g); o_intra [C, BV]."""
    hs_ref, state_ref, loc_ref, intra_ref = rest if save_states else (None, *rest)
    t = pl.program_id(2)

    @pl.when(first_ref[t] == 1)
    def _():
        state_ref[...] = h0_ref[...].astype(jnp.float32)

    S = state_ref[...]
    if save_states:
        hs_ref[...] = S
    q, k, v, g = _load(q_ref), _load(k_ref), _load(v_ref), _load(g_ref)
    C = q.shape[0]
    sums = intra.BlockSums(C)
    loc, tot, gc = sums.cumsum(g)
    loc_ref[...] = loc
    sel = intra.PairSelectors(sums.c)

    def block(i, rows, lb):
        intra_ref[rows, :] = intra.block_o(i, sel, sums, q, k, v, loc, tot, _load(q_ref, rows),
                                           _load(k_ref, rows), _load(v_ref, rows), lb)

    intra.for_each_block(C, loc_ref, block)
    o = intra.dot(q * jnp.exp(gc), S, intra.LANE_PIECE) + intra_ref[...]
    o_ref[...] = (scale * o).astype(o_ref.dtype)
    _, g_last_col = sums.total(tot)
    if active("gla_decay_last_row_only"):  # mutation suite: the state decays by the last row's gate only
        g_last_col = intra.dot_tn(g[C - 1:C, :], jnp.ones((1, 1), jnp.float32))
    S = jnp.exp(g_last_col) * S + intra.dot_tn(k * jnp.exp(sums.suffix(loc, tot)), v, intra.SUB)
    state_ref[...] = S
    ht_ref[...] = S


def _dg_mid(sums, loc, tot, q, k, v, do, S, dS, scale):
    """For a chunk longer than SEGMENT rows: the gradient of the gate of every row before
    row m = SEGMENT through all that follows it, sum_V(S_m * dS_m) [1, K], with S_m the
    state after row m - 1 and dS_m its gradient. As in FLA's 64-row chunks, this replaces a
    long sum of the nearly cancelling terms q * dq - k * dk of the rows from m on.

    loc, tot: BlockSums.cumsum of g; S, dS [K, V]: the state at the chunk start and the
    gradient of the state at the chunk end."""
    C = q.shape[0]
    mb = SEGMENT // sums.c
    first = intra.iota((C, 1), 0) < SEGMENT
    to_mid = intra.dot(sums.blocks(lambda b: b, mb), tot) - loc        # gc_{m-1} - gc_s, s < m
    from_mid = intra.dot(sums.blocks(mb, lambda b: b), tot) + loc      # gc_t - gc_{m-1}, t >= m
    g_before, g_after = sums.split(tot, SEGMENT)                          # [K, 1] each
    k_mid = jnp.where(first, k * jnp.exp(jnp.minimum(to_mid, 0.0)), 0.0)
    q_mid = jnp.where(first, 0.0, q * jnp.exp(jnp.minimum(from_mid, 0.0)))
    S_mid = jnp.exp(g_before) * S + intra.dot_tn(k_mid, v, intra.SUB)
    dS_mid = jnp.exp(g_after) * dS + scale * intra.dot_tn(q_mid, do, intra.SUB)
    return intra.dot_nt(jnp.ones((1, v.shape[1]), jnp.float32), S_mid * dS_mid, intra.LANE_PIECE)


def _bwd_kernel(seq_ref, first_ref, last_ref, q_ref, k_ref, v_ref, g_ref, hs_ref, do_ref, dht_ref,
                dq_ref, dk_ref, dv_ref, dg_ref, dh0_ref, dstate_ref, loc_ref, dqa_ref, dka_ref, dva_ref,
                *, scale):
    """One (head, chunk), chunks in reverse: q, k, g [C, K]; v, do [C, V]; hs, dht, dh0 [K, V].
    Scratch: dstate [K, V]; loc, dqa, dka [C, K]; dva [C, V] (the gradients through A)."""
    t = pl.num_programs(1) - 1 - pl.program_id(1)

    @pl.when(last_ref[t] == 1)
    def _():
        dstate_ref[...] = dht_ref[...].astype(jnp.float32)

    dS = dstate_ref[...]                     # gradient of the state at the chunk end
    S = hs_ref[...]                          # the state at the chunk start
    q, k, v, do, g = _load(q_ref), _load(k_ref), _load(v_ref), _load(do_ref), _load(g_ref)
    C, V = v.shape
    sums = intra.BlockSums(C)
    loc, tot, gc = sums.cumsum(g)
    loc_ref[...] = loc
    sel = intra.PairSelectors(sums.c)

    def block(i, rows, lb):
        dqa, dka, dva = intra.block_grads(i, sel, sums, q, k, v, do, loc, tot, _load(q_ref, rows),
                                          _load(k_ref, rows), _load(v_ref, rows), _load(do_ref, rows),
                                          lb, scale)
        dqa_ref[rows, :] = dqa
        dka_ref[rows, :] = dka
        dva_ref[rows, :] = dva

    intra.for_each_block(C, loc_ref, block)
    g_last, g_last_col = sums.total(tot)
    q_decay = jnp.exp(gc)
    k_decay = jnp.exp(sums.suffix(loc, tot))
    dq = scale * intra.dot_nt(do, S, intra.LANE_PIECE) * q_decay + dqa_ref[...]
    dk_state = intra.dot_nt(v, dS, intra.LANE_PIECE) * k_decay
    dk = dk_state + dka_ref[...]
    dv = intra.dot(k * k_decay, dS, intra.LANE_PIECE) + dva_ref[...]
    # gradient of gc; g_last also scales the carried state and the keys' decay
    dgc = q * dq - k * dk
    dg_last = (intra.row_sum(k * dk_state)
               + intra.dot_nt(jnp.ones((1, V), jnp.float32), dS * S, intra.LANE_PIECE) * jnp.exp(g_last))
    if C <= SEGMENT:
        dg = sums.reverse_cumsum(dgc) + dg_last
    else:
        dg_mid = _dg_mid(sums, loc, tot, q, k, v, do, S, dS, scale)
        first = intra.iota((C, 1), 0) < SEGMENT
        dg = sums.reverse_cumsum(dgc, SEGMENT) + jnp.where(first, dg_mid, dg_last)
    dS = scale * intra.dot_tn(q * q_decay, do, intra.SUB) + jnp.exp(g_last_col) * dS
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
    dg_ref[...] = dg
    dstate_ref[...] = dS
    dh0_ref[...] = dS


# ---------------------------------------------------------------- pallas calls
def _compiler_params(semantics):
    return pltpu.CompilerParams(dimension_semantics=semantics)


def _fwd_call(q, k, v, g, h0, seq, first, last, *, scale, chunk, save_states):
    """Packed q, k, g [H, NT * C, K]; v [H, NT * C, V]; h0 [N, H, K, V] ->
    (o [H, NT * C, V], ht [N, H, K, V] float32[, hs [H, NT, K, V] float32])."""
    H, TP, K = q.shape
    V = v.shape[-1]
    N = h0.shape[0]
    NT = TP // chunk
    BV = min(V, MAX_V_TILE)
    tok_k = pl.BlockSpec((None, chunk, K), lambda h, iv, t, *_: (h, t, 0))
    tok_v = pl.BlockSpec((None, chunk, BV), lambda h, iv, t, *_: (h, t, iv))
    state = pl.BlockSpec((None, None, K, BV), lambda h, iv, t, seq, *_: (seq[t], h, 0, iv))
    out_specs = [tok_v, state]
    out_shape = [jax.ShapeDtypeStruct((H, TP, V), q.dtype), jax.ShapeDtypeStruct((N, H, K, V), jnp.float32)]
    if save_states:
        out_specs.append(pl.BlockSpec((None, None, K, BV), lambda h, iv, t, *_: (h, t, 0, iv)))
        out_shape.append(jax.ShapeDtypeStruct((H, NT, K, V), jnp.float32))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3, grid=(H, V // BV, NT),
        in_specs=[tok_k, tok_k, tok_v, tok_k, state], out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM((K, BV), jnp.float32), pltpu.VMEM((chunk, K), jnp.float32),
                        pltpu.VMEM((chunk, BV), jnp.float32)])
    kernel = functools.partial(_fwd_kernel, scale=scale, save_states=save_states)
    return pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=out_shape,
        compiler_params=_compiler_params(("parallel", "parallel", "arbitrary")),
        interpret=interpret_mode(), name="gla_chunk_fwd")(seq, first, last, q, k, v, g, h0)


def _bwd_call(q, k, v, g, hs, do, dht, seq, first, last, *, scale, chunk):
    """Packed inputs as in _fwd_call, hs [H, NT, K, V], do [H, NT * C, V], dht [N, H, K, V] ->
    (dq, dk [H, NT * C, K] (input dtypes), dv, dg float32 [H, NT * C, K], dh0 [N, H, K, V])."""
    H, TP, K = q.shape
    V = v.shape[-1]
    N = dht.shape[0]
    NT = TP // chunk

    def rev(t):
        return NT - 1 - t

    tok_k = pl.BlockSpec((None, chunk, K), lambda h, t, *_: (h, rev(t), 0))
    tok_v = pl.BlockSpec((None, chunk, V), lambda h, t, *_: (h, rev(t), 0))
    chunk_state = pl.BlockSpec((None, None, K, V), lambda h, t, *_: (h, rev(t), 0, 0))
    seq_state = pl.BlockSpec((None, None, K, V), lambda h, t, seq, *_: (seq[rev(t)], h, 0, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3, grid=(H, NT),
        in_specs=[tok_k, tok_k, tok_v, tok_k, chunk_state, tok_v, seq_state],
        out_specs=[tok_k, tok_k, tok_v, tok_k, seq_state],
        scratch_shapes=[pltpu.VMEM((K, V), jnp.float32), pltpu.VMEM((chunk, K), jnp.float32),
                        pltpu.VMEM((chunk, K), jnp.float32), pltpu.VMEM((chunk, K), jnp.float32),
                        pltpu.VMEM((chunk, V), jnp.float32)])
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                 jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct(g.shape, jnp.float32),
                 jax.ShapeDtypeStruct((N, H, K, V), jnp.float32)]
    return pl.pallas_call(
        functools.partial(_bwd_kernel, scale=scale), grid_spec=grid_spec, out_shape=out_shape,
        compiler_params=_compiler_params(("parallel", "arbitrary")),
        interpret=interpret_mode(), name="gla_chunk_bwd")(seq, first, last, q, k, v, g, hs, do, dht)


# ---------------------------------------------------------------- autodiff
@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9))
def _gla_packed(q, k, v, g, h0, seq, first, last, scale, chunk):
    """Packed forward -> (o [H, NT * C, V], ht [N, H, K, V])."""
    return tuple(_fwd_call(q, k, v, g, h0, seq, first, last, scale=scale, chunk=chunk, save_states=False))


def _gla_packed_fwd(q, k, v, g, h0, seq, first, last, scale, chunk):
    o, ht, hs = _fwd_call(q, k, v, g, h0, seq, first, last, scale=scale, chunk=chunk, save_states=True)
    return (o, ht), (q, k, v, g, hs, seq, first, last)


def _gla_packed_bwd(scale, chunk, residuals, cotangents):
    q, k, v, g, hs, seq, first, last = residuals
    do, dht = cotangents
    dq, dk, dv, dg, dh0 = _bwd_call(q, k, v, g, hs, do.astype(v.dtype), dht.astype(jnp.float32),
                                    seq, first, last, scale=scale, chunk=chunk)
    return dq, dk, dv, dg, dh0, None, None, None


_gla_packed.defvjp(_gla_packed_fwd, _gla_packed_bwd)


# ---------------------------------------------------------------- public entry point
def _shape(x, name):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{name} must be an array, got {type(x).__name__}")
    return tuple(x.shape)


def check_supported(K: int, V: int, dtype=None) -> None:
    """NoKernel unless the kernels tile K and V (powers of two from 16 to 256) and take dtype
    (float32, bfloat16)."""
    validation.check_supported("gla", K, V, dtype, lambda d: d in HEAD_DIMS, f"one of {HEAD_DIMS}", INPUT_DTYPES)


def _validate(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size):
    """Checks every argument before any kernel runs; returns (B, T, H, K, V, N)."""
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size={chunk_size!r} is not supported: expected one of {CHUNK_SIZES}")
    qs = _shape(q, "q")
    if len(qs) != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {qs}")
    B, T, H, K = qs
    for name, x in (("k", k), ("g", g)):
        if _shape(x, name) != qs:
            raise ValueError(f"{name} must have q's shape [B, T, H, K] = {qs}, got {tuple(x.shape)}")
    vs = _shape(v, "v")
    if len(vs) != 4 or vs[:3] != qs[:3]:
        raise ValueError(f"v must be [B, T, H, V] with B, T, H = {qs[:3]}, got shape {vs}")
    V = vs[3]
    check_supported(K, V)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.dtype(x.dtype) not in INPUT_DTYPES:
            check_supported(K, V, x.dtype)
    if not (jnp.dtype(q.dtype) == jnp.dtype(k.dtype) == jnp.dtype(v.dtype)):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not jnp.issubdtype(g.dtype, jnp.floating):
        raise ValueError(f"g must be floating point (log-decays), got {g.dtype}")
    if scale is not None and not (isinstance(scale, numbers.Real) and not isinstance(scale, bool) and scale > 0):
        raise ValueError(f"scale must be None (K ** -0.5) or a positive number, got {scale!r}")
    if not isinstance(output_final_state, (bool, np.bool_)):
        raise ValueError(f"output_final_state must be a bool, got {output_final_state!r}")
    N = B
    if cu_seqlens is not None:
        cs = _shape(cu_seqlens, "cu_seqlens")
        if len(cs) != 1 or cs[0] < 2:
            raise ValueError(f"cu_seqlens must be 1-D [N + 1] with N >= 1, got shape {cs}")
        if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer):
            raise ValueError(f"cu_seqlens must be integer, got {cu_seqlens.dtype}")
        if B != 1:
            raise ValueError(f"cu_seqlens (varlen) needs B == 1 (sequences packed along T), got B={B}")
        N = cs[0] - 1
        if not isinstance(cu_seqlens, jax.core.Tracer):
            cu = np.asarray(cu_seqlens)
            if cu[0] != 0 or cu[-1] != T or np.any(np.diff(cu) < 0):
                raise ValueError(f"cu_seqlens must rise from 0 to T={T} without decreasing, got {cu.tolist()}")
    if initial_state is not None:
        hs = _shape(initial_state, "initial_state")
        if hs != (N, H, K, V):
            raise ValueError(f"initial_state must be [N, H, K, V] = {(N, H, K, V)}, got {hs}")
        if not jnp.issubdtype(initial_state.dtype, jnp.floating):
            raise ValueError(f"initial_state must be floating point, got {initial_state.dtype}")
    return B, T, H, K, V, N


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
              chunk_size=64):
    """GLA with per-channel log-decay, chunked Pallas kernels (FLA's chunk_gla convention).

    q, k, g [B, T, H, K]; v [B, T, H, V] (q, k, v float32 or bfloat16; g any float, used
    in float32); initial_state [N, H, K, V]; cu_seqlens int [N + 1] with B == 1 (varlen).
    Returns (o [B, T, H, V] in q's dtype, final_state [N, H, K, V] float32 or None).
    Differentiable in q, k, v, g and initial_state.
    """
    B, T, H, K, V, N = _validate(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens,
                                 chunk_size)
    scale = float(K ** -0.5 if scale is None else scale)
    o, ht = _chunk_gla_jit(q, k, v, g, initial_state, cu_seqlens, scale=scale, chunk=chunk_size)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnames=("scale", "chunk"))
def _chunk_gla_jit(q, k, v, g, initial_state, cu_seqlens, *, scale, chunk):
    """Validated arguments -> (o [B, T, H, V], final_state [N, H, K, V] float32)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    layout: Layout = dense_layout(B, T, chunk) if cu_seqlens is None else varlen_layout(cu_seqlens, T, chunk)
    h0 = (jnp.zeros((layout.N, H, K, V), jnp.float32) if initial_state is None
          else initial_state.astype(jnp.float32))
    o, ht = _gla_packed(layout.pack(q), layout.pack(k), layout.pack(v), layout.pack(g.astype(jnp.float32)),
                        h0, layout.seq, layout.first, layout.last, scale, chunk)
    return layout.unpack(o), ht
