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
Shapes (FLA layout): q, k, g [B, T, H, K]; v [B, T, H, V]; states [N, H, K, V] float32; the
kernels see the packed layout of common/layout.py with K and V padded to multiples of 32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common.config import KernelConfig, prepare
from kernels_jax.common.kernel_math import advance_state, params, state_grad_step
from kernels_jax.common.layout import ChunkLayout
from kernels_jax.common.platform import interpret_mode

from . import intra

ALIGN = intra.LANE_PIECE  # head dims padded to whole pieces of the in-kernel contractions
SEGMENT = 64  # backward: the gate gradient of longer chunks goes through the state every 64 rows


# ---------------------------------------------------------------- kernels
def _load(ref, rows=None):
    return (ref[...] if rows is None else ref[rows, :]).astype(jnp.float32)


def _fwd_kernel(
    seq_ref, first_ref, last_ref, q_ref, k_ref, v_ref, g_ref, h0_ref, o_ref, ht_ref, *rest, scale, save_states
):
    """One (head, V tile, chunk): q, k, g [C, K]; v, o [C, BV]; h0, ht, hs [K, BV].
    Scratch: state [K, BV]; loc [C, K] (block-local cumsum of g); o_intra [C, BV]."""
    hs_ref, state_ref, loc_ref, intra_ref = rest if save_states else (None, *rest)
    t = pl.program_id(2)

    @pl.when(first_ref[t] == 1)
    def load_initial_state():
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
        intra_ref[rows, :] = intra.block_o(
            i, sel, sums, q, k, v, loc, tot, _load(q_ref, rows), _load(k_ref, rows), _load(v_ref, rows), lb
        )

    intra.for_each_block(C, loc_ref, block)
    o = intra.dot(q * jnp.exp(gc), S, intra.LANE_PIECE) + intra_ref[...]
    o_ref[...] = (scale * o).astype(o_ref.dtype)
    _, g_last_col = sums.total(tot)
    S = advance_state(S, k, v, jnp.exp(g_last_col), jnp.exp(sums.suffix(loc, tot)), piece=intra.SUB)
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
    to_mid = intra.dot(sums.blocks(lambda b: b, mb), tot) - loc  # gc_{m-1} - gc_s, s < m
    from_mid = intra.dot(sums.blocks(mb, lambda b: b), tot) + loc  # gc_t - gc_{m-1}, t >= m
    g_before, g_after = sums.split(tot, SEGMENT)  # [K, 1] each
    k_mid = jnp.where(first, k * jnp.exp(jnp.minimum(to_mid, 0.0)), 0.0)
    q_mid = jnp.where(first, 0.0, q * jnp.exp(jnp.minimum(from_mid, 0.0)))
    S_mid = advance_state(S, k_mid, v, jnp.exp(g_before), 1.0, piece=intra.SUB)
    dS_mid = state_grad_step(dS, q_mid, do, jnp.exp(g_after), 1.0, scale, piece=intra.SUB)
    return intra.dot_nt(jnp.ones((1, v.shape[1]), jnp.float32), S_mid * dS_mid, intra.LANE_PIECE)


def _bwd_kernel(
    seq_ref,
    first_ref,
    last_ref,
    q_ref,
    k_ref,
    v_ref,
    g_ref,
    hs_ref,
    do_ref,
    dht_ref,
    dq_ref,
    dk_ref,
    dv_ref,
    dg_ref,
    dh0_ref,
    dstate_ref,
    loc_ref,
    dqa_ref,
    dka_ref,
    dva_ref,
    *,
    scale,
):
    """One (head, chunk), chunks in reverse: q, k, g [C, K]; v, do [C, V]; hs, dht, dh0 [K, V].
    Scratch: dstate [K, V]; loc, dqa, dka [C, K]; dva [C, V] (the gradients through A)."""
    t = pl.num_programs(1) - 1 - pl.program_id(1)

    @pl.when(last_ref[t] == 1)
    def load_final_state_grad():
        dstate_ref[...] = dht_ref[...].astype(jnp.float32)

    dS = dstate_ref[...]  # gradient of the state at the chunk end
    S = hs_ref[...]  # the state at the chunk start
    q, k, v, do, g = _load(q_ref), _load(k_ref), _load(v_ref), _load(do_ref), _load(g_ref)
    C, V = v.shape
    sums = intra.BlockSums(C)
    loc, tot, gc = sums.cumsum(g)
    loc_ref[...] = loc
    sel = intra.PairSelectors(sums.c)

    def block(i, rows, lb):
        dqa, dka, dva = intra.block_grads(
            i,
            sel,
            sums,
            q,
            k,
            v,
            do,
            loc,
            tot,
            _load(q_ref, rows),
            _load(k_ref, rows),
            _load(v_ref, rows),
            _load(do_ref, rows),
            lb,
            scale,
        )
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
    dg_last = intra.row_sum(k * dk_state) + intra.dot_nt(
        jnp.ones((1, V), jnp.float32), dS * S, intra.LANE_PIECE
    ) * jnp.exp(g_last)
    if C <= SEGMENT:
        dg = sums.reverse_cumsum(dgc) + dg_last
    else:
        dg_mid = _dg_mid(sums, loc, tot, q, k, v, do, S, dS, scale)
        first = intra.iota((C, 1), 0) < SEGMENT
        dg = sums.reverse_cumsum(dgc, SEGMENT) + jnp.where(first, dg_mid, dg_last)
    dS = state_grad_step(dS, q, do, jnp.exp(g_last_col), q_decay, scale, piece=intra.SUB)
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
    dg_ref[...] = dg
    dstate_ref[...] = dS
    dh0_ref[...] = dS


# ---------------------------------------------------------------- pallas calls
def _fwd_call(q, k, v, g, h0, seq, first, last, cfg: KernelConfig, *, save_states):
    """Packed q, k, g [H, NT * C, K]; v [H, NT * C, V]; h0 [N, H, K, V] ->
    (o [H, NT * C, V], ht [N, H, K, V] float32[, hs [H, NT, K, V] float32])."""
    H, K, V, N, NT, chunk, BV = cfg.H, cfg.K, cfg.V, cfg.N, cfg.NT, cfg.C, cfg.bv
    TP = NT * chunk
    tok_k = pl.BlockSpec((None, chunk, K), lambda h, iv, t, *_: (h, t, 0))
    tok_v = pl.BlockSpec((None, chunk, BV), lambda h, iv, t, *_: (h, t, iv))
    state = pl.BlockSpec((None, None, K, BV), lambda h, iv, t, seq, *_: (seq[t], h, 0, iv))
    out_specs = [tok_v, state]
    out_shape = [jax.ShapeDtypeStruct((H, TP, V), q.dtype), jax.ShapeDtypeStruct((N, H, K, V), jnp.float32)]
    if save_states:
        out_specs.append(pl.BlockSpec((None, None, K, BV), lambda h, iv, t, *_: (h, t, 0, iv)))
        out_shape.append(jax.ShapeDtypeStruct((H, NT, K, V), jnp.float32))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(H, V // BV, NT),
        in_specs=[tok_k, tok_k, tok_v, tok_k, state],
        out_specs=out_specs,
        scratch_shapes=[
            pltpu.VMEM((K, BV), jnp.float32),
            pltpu.VMEM((chunk, K), jnp.float32),
            pltpu.VMEM((chunk, BV), jnp.float32),
        ],
    )
    kernel = functools.partial(_fwd_kernel, scale=cfg.scale, save_states=save_states)
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=out_shape,
        compiler_params=params("parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="gla_chunk_fwd",
    )(seq, first, last, q, k, v, g, h0)


def _bwd_call(q, k, v, g, hs, do, dht, seq, first, last, cfg: KernelConfig):
    """Packed inputs as in _fwd_call, hs [H, NT, K, V], do [H, NT * C, V], dht [N, H, K, V] ->
    (dq, dk [H, NT * C, K] (input dtypes), dv, dg float32 [H, NT * C, K], dh0 [N, H, K, V])."""
    H, K, V, N, NT, chunk = cfg.H, cfg.K, cfg.V, cfg.N, cfg.NT, cfg.C

    def rev(t):
        return NT - 1 - t

    tok_k = pl.BlockSpec((None, chunk, K), lambda h, t, *_: (h, rev(t), 0))
    tok_v = pl.BlockSpec((None, chunk, V), lambda h, t, *_: (h, rev(t), 0))
    chunk_state = pl.BlockSpec((None, None, K, V), lambda h, t, *_: (h, rev(t), 0, 0))
    seq_state = pl.BlockSpec((None, None, K, V), lambda h, t, seq, *_: (seq[rev(t)], h, 0, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(H, NT),
        in_specs=[tok_k, tok_k, tok_v, tok_k, chunk_state, tok_v, seq_state],
        out_specs=[tok_k, tok_k, tok_v, tok_k, seq_state],
        scratch_shapes=[
            pltpu.VMEM((K, V), jnp.float32),
            pltpu.VMEM((chunk, K), jnp.float32),
            pltpu.VMEM((chunk, K), jnp.float32),
            pltpu.VMEM((chunk, K), jnp.float32),
            pltpu.VMEM((chunk, V), jnp.float32),
        ],
    )
    out_shape = [
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct(g.shape, jnp.float32),
        jax.ShapeDtypeStruct((N, H, K, V), jnp.float32),
    ]
    return pl.pallas_call(
        functools.partial(_bwd_kernel, scale=cfg.scale),
        grid_spec=grid_spec,
        out_shape=out_shape,
        compiler_params=params("parallel", "arbitrary"),
        interpret=interpret_mode(),
        name="gla_chunk_bwd",
    )(seq, first, last, q, k, v, g, hs, do, dht)


# ---------------------------------------------------------------- autodiff
@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _gla_packed(q, k, v, g, h0, seq, first, last, cfg: KernelConfig):
    """Packed forward -> (o [H, NT * C, V], ht [N, H, K, V])."""
    return tuple(_fwd_call(q, k, v, g, h0, seq, first, last, cfg, save_states=False))


def _gla_packed_fwd(q, k, v, g, h0, seq, first, last, cfg):
    o, ht, hs = _fwd_call(q, k, v, g, h0, seq, first, last, cfg, save_states=True)
    return (o, ht), (q, k, v, g, hs, seq, first, last)


def _gla_packed_bwd(cfg, residuals, cotangents):
    q, k, v, g, hs, seq, first, last = residuals
    do, dht = cotangents
    dq, dk, dv, dg, dh0 = _bwd_call(q, k, v, g, hs, do.astype(v.dtype), dht.astype(jnp.float32), seq, first, last, cfg)
    return dq, dk, dv, dg, dh0, None, None, None


_gla_packed.defvjp(_gla_packed_fwd, _gla_packed_bwd)


# ---------------------------------------------------------------- public entry point
def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64):
    """GLA with per-channel log-decay, chunked Pallas kernels (FLA's chunk_gla convention).

    q, k, g [B, T, H, K]; v [B, T, H, V] (q, k, v float32 or bfloat16; g any float, used
    in float32); initial_state [N, H, K, V]; cu_seqlens int [N + 1] with B == 1 (varlen).
    Returns (o [B, T, H, V] in q's dtype, final_state [N, H, K, V] float32 or None).
    Differentiable in q, k, v, g and initial_state.
    """
    layout, cfg = prepare(
        "gla",
        q,
        k,
        v,
        align=ALIGN,
        g=g,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    o, ht = _chunk_gla_jit(q, k, v, g, initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(6,))
def _chunk_gla_jit(q, k, v, g, initial_state, layout: ChunkLayout, cfg: KernelConfig):
    """The stages as one program: pack (K, V padded), the kernels, unpack.
    -> (o [B, T, H, V], final_state [N, H, K, V] float32)."""
    h0 = jnp.zeros((cfg.N, cfg.H, cfg.K, cfg.V), jnp.float32) if initial_state is None else cfg.pad_state(initial_state)
    o, ht = _gla_packed(
        layout.pack(q, cfg.K),
        layout.pack(k, cfg.K),
        layout.pack(v, cfg.V),
        layout.pack(g.astype(jnp.float32), cfg.K),
        h0,
        *layout.tables(),
        cfg,
    )
    return layout.unpack(o, cfg.V_in), cfg.cut_state(ht)
