"""Chunked Simple GLA: Pallas TPU kernels for forward and backward, behind jax.custom_vjp.

Recurrence (per sequence and head; S [K, V] float32):
    S_t = exp(g_t) S_{t-1} + k_t^T v_t,     o_t = scale * q_t S_t
With b the chunk-local cumulative sum of g (b_i <= 0, non-increasing), h_c the state
before chunk c and dh_c the gradient w.r.t. the state after chunk c:
    o_i    = scale * [sum_{j<=i} exp(b_i - b_j) (q_i.k_j) v_j + exp(b_i) q_i h_c]
    h_c+1  = exp(b_C) h_c + sum_j exp(b_C - b_j) k_j^T v_j
    dh_c-1 = exp(b_C) dh_c + scale * sum_i exp(b_i) q_i^T do_i
    db_i   = q_i.dq_i - k_i.dk_i  (+ <h_c+1, dh_c> on the chunk's last slot)
Every exponent is <= 0 (seeds 000/001); states, decays and every dot accumulate in
float32. The kernels (stages, FLA's names):
    chunk_fwd_h      grid (R, H, K/bk, V/bv, NT)  sequential over chunks, state in VMEM scratch
    chunk_fwd_o      grid (R, H, V/bv, NT, K/bk)  K tiles accumulated in scratch
    chunk_bwd_dh     grid (R, H, K/bk, V/bv, NT)  reverse over chunks
    chunk_bwd_dv     grid (R, H, NT, V/bv, K/bk)
    chunk_bwd_dqk    grid (R, H, NT, K/bk, V/bv)  also db per K tile
Layouts (kernels_jax/common/chunking.py): q, k [R, H, S, K]; v, do [R, H, S, V]; S = NT * C;
b [R, H, NT, C]; h, dh [R, H, NT, K, V]; h0, ht [N, H, K, V].
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common import chunking, validation
from kernels_jax.common.kernel_math import F32, causal_decay, dot, factorised_decay, params, row_sum, total
from kernels_jax.common.mutation import active
from kernels_jax.common.platform import interpret_mode


@dataclasses.dataclass(frozen=True)
class Config:
    """Static description of one call: shapes, tiles, scale and the chunk tables."""
    R: int
    H: int
    K: int
    V: int
    C: int
    NT: int
    N: int
    scale: float
    tables: tuple[tuple[int, ...], ...]   # seq, first, last (ints [NT])
    has_h0: bool

    @property
    def bk(self) -> int:
        return 128 if self.K % 128 == 0 else self.K

    @property
    def bv(self) -> int:
        return 128 if self.V % 128 == 0 else self.V

    @property
    def nk(self) -> int:
        return self.K // self.bk

    @property
    def nv(self) -> int:
        return self.V // self.bv

    def prefetch(self):
        return [jnp.asarray(t, jnp.int32) for t in self.tables]


def _decay_to_end(b_col, b_row):
    """(exp(b_C) [1, 1], exp(b_C - b_j) [C, 1]) for the chunk's last slot C."""
    b_last = b_row[:, -1:]
    return jnp.exp(b_last), jnp.exp(b_last - b_col)


def _intra_decay(b_col, b_row, *, transpose=False, backward=False):
    if backward and active("factorised_decay_bwd"):
        return factorised_decay(b_col, b_row, transpose=transpose)
    return causal_decay(b_col, b_row, transpose=transpose, strict=active("strict_causal_mask"),
                        unmasked=not backward and active("unmasked_decay_exp"))


# ---------------------------------------------------------------------------------------------
# forward


def _fwd_h_kernel(seq_ref, first_ref, last_ref, k_ref, v_ref, bcol_ref, brow_ref, *rest, has_h0):
    """One chunk of state passing: emit h_c (state before), update the state, emit ht at the end."""
    h0_ref, (h_ref, ht_ref, state) = (rest[0], rest[1:]) if has_h0 else (None, rest)
    c = pl.program_id(4)
    reset = (c == 0) if active("varlen_no_reset") else (first_ref[c] == 1)

    @pl.when(reset)
    def _():
        state[...] = h0_ref[...].astype(F32) if has_h0 else jnp.zeros(state.shape, F32)

    h_ref[...] = state[...].astype(h_ref.dtype)
    early = active("ht_one_chunk_early")

    @pl.when(last_ref[c] == 1)
    def _():
        if early:
            ht_ref[...] = state[...]

    decay_all, decay_to_end = _decay_to_end(bcol_ref[...], brow_ref[...])
    new = decay_all * state[...] + dot(k_ref[...] * decay_to_end, v_ref[...], trans_a=True)
    if active("state_bf16"):
        new = new.astype(jnp.bfloat16).astype(F32)
    state[...] = new

    @pl.when(last_ref[c] == 1)
    def _():
        if not early:
            ht_ref[...] = new


def chunk_fwd_h(k, v, b, h0, cfg: Config):
    """h [R, H, NT, K, V] (state before each chunk; float32) and ht [N, H, K, V] float32."""
    C, bk, bv = cfg.C, cfg.bk, cfg.bv
    chunk = lambda r, h, i, j, c, *t: (r, h, c, 0)
    in_specs = [pl.BlockSpec((None, None, C, bk), lambda r, h, i, j, c, *t: (r, h, c, i)),
                pl.BlockSpec((None, None, C, bv), lambda r, h, i, j, c, *t: (r, h, c, j)),
                pl.BlockSpec((None, None, C, 1), chunk),
                pl.BlockSpec((None, None, None, 1, C), lambda r, h, i, j, c, *t: (r, h, c, 0, 0))]
    state_spec = pl.BlockSpec((None, None, bk, bv), lambda r, h, i, j, c, seq, *t: (r + seq[c], h, i, j))
    args = [k, v, b.reshape(cfg.R, cfg.H, cfg.NT * C, 1), b.reshape(cfg.R, cfg.H, cfg.NT, 1, C)]
    if cfg.has_h0:
        in_specs.append(state_spec)
        args.append(h0)
    h_dtype = jnp.bfloat16 if active("state_bf16") else F32
    return pl.pallas_call(
        functools.partial(_fwd_h_kernel, has_h0=cfg.has_h0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3, grid=(cfg.R, cfg.H, cfg.nk, cfg.nv, cfg.NT), in_specs=in_specs,
            out_specs=[pl.BlockSpec((None, None, None, bk, bv), lambda r, h, i, j, c, *t: (r, h, c, i, j)),
                       state_spec],
            scratch_shapes=[pltpu.VMEM((bk, bv), F32)]),
        out_shape=[jax.ShapeDtypeStruct((cfg.R, cfg.H, cfg.NT, cfg.K, cfg.V), h_dtype),
                   jax.ShapeDtypeStruct((cfg.N, cfg.H, cfg.K, cfg.V), F32)],
        compiler_params=params("parallel", "parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(), name="simple_gla_chunk_fwd_h",
    )(*cfg.prefetch(), *args)


def _fwd_o_kernel(q_ref, k_ref, v_ref, h_ref, bcol_ref, brow_ref, o_ref, acc_qk, acc_qh, *, scale, nk):
    """o for one chunk and V tile; q.k and q.h accumulate over K tiles (grid axis 4)."""
    i = pl.program_id(4)
    q = q_ref[...]
    qk, qh = dot(q, k_ref[...], trans_b=True), dot(q, h_ref[...])

    @pl.when(i == 0)
    def _():
        acc_qk[...], acc_qh[...] = qk, qh

    @pl.when(i > 0)
    def _():
        if active("tile_overwrite"):
            acc_qk[...], acc_qh[...] = qk, qh
        else:
            acc_qk[...] += qk
            acc_qh[...] += qh

    @pl.when(i == nk - 1)
    def _():
        b_col, b_row = bcol_ref[...], brow_ref[...]
        scores = acc_qk[...] * _intra_decay(b_col, b_row) * scale
        if active("intra_scale_twice"):
            scores = scores * scale
        o = dot(scores, v_ref[...]) + (scale * jnp.exp(b_col)) * acc_qh[...]
        o_ref[...] = o.astype(o_ref.dtype)


def chunk_fwd_o(q, k, v, h, b, cfg: Config):
    """o [R, H, S, V] in q's dtype."""
    C, bk, bv = cfg.C, cfg.bk, cfg.bv
    return pl.pallas_call(
        functools.partial(_fwd_o_kernel, scale=cfg.scale, nk=cfg.nk),
        grid=(cfg.R, cfg.H, cfg.nv, cfg.NT, cfg.nk),
        in_specs=[pl.BlockSpec((None, None, C, bk), lambda r, h, j, c, i: (r, h, c, i)),
                  pl.BlockSpec((None, None, C, bk), lambda r, h, j, c, i: (r, h, c, i)),
                  pl.BlockSpec((None, None, C, bv), lambda r, h, j, c, i: (r, h, c, j)),
                  pl.BlockSpec((None, None, None, bk, bv), lambda r, h, j, c, i: (r, h, c, i, j)),
                  pl.BlockSpec((None, None, C, 1), lambda r, h, j, c, i: (r, h, c, 0)),
                  pl.BlockSpec((None, None, None, 1, C), lambda r, h, j, c, i: (r, h, c, 0, 0))],
        out_specs=pl.BlockSpec((None, None, C, bv), lambda r, h, j, c, i: (r, h, c, j)),
        out_shape=jax.ShapeDtypeStruct(v.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((C, C), F32), pltpu.VMEM((C, bv), F32)],
        compiler_params=params("parallel", "parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(), name="simple_gla_chunk_fwd_o",
    )(q, k, v, h, b.reshape(cfg.R, cfg.H, cfg.NT * C, 1), b.reshape(cfg.R, cfg.H, cfg.NT, 1, C))


# ---------------------------------------------------------------------------------------------
# backward


def _bwd_dh_kernel(seq_ref, first_ref, last_ref, q_ref, do_ref, bcol_ref, brow_ref, dht_ref, dh_ref, *rest,
                   scale, NT, has_h0):
    """One chunk of the reverse state-gradient pass: emit dh_c (w.r.t. the state after chunk c)."""
    dh0_ref, dstate = rest if has_h0 else (None, rest[0])
    c = NT - 1 - pl.program_id(4)

    @pl.when(last_ref[c] == 1)
    def _():
        dstate[...] = dht_ref[...].astype(F32)

    dh_ref[...] = dstate[...]
    b_col = bcol_ref[...]
    decay_all, _ = _decay_to_end(b_col, brow_ref[...])
    new = decay_all * dstate[...] + scale * dot(q_ref[...] * jnp.exp(b_col), do_ref[...], trans_a=True)
    dstate[...] = new

    if has_h0:
        @pl.when(first_ref[c] == 1)
        def _():
            dh0_ref[...] = new


def chunk_bwd_dh(q, do, b, dht, cfg: Config):
    """dh [R, H, NT, K, V] (gradient w.r.t. the state after each chunk) and dh0 [N, H, K, V] or None."""
    C, bk, bv, NT = cfg.C, cfg.bk, cfg.bv, cfg.NT
    rev = lambda c: NT - 1 - c
    state_spec = pl.BlockSpec((None, None, bk, bv), lambda r, h, i, j, c, seq, *t: (r + seq[rev(c)], h, i, j))
    in_specs = [pl.BlockSpec((None, None, C, bk), lambda r, h, i, j, c, *t: (r, h, rev(c), i)),
                pl.BlockSpec((None, None, C, bv), lambda r, h, i, j, c, *t: (r, h, rev(c), j)),
                pl.BlockSpec((None, None, C, 1), lambda r, h, i, j, c, *t: (r, h, rev(c), 0)),
                pl.BlockSpec((None, None, None, 1, C), lambda r, h, i, j, c, *t: (r, h, rev(c), 0, 0)),
                state_spec]
    out_specs = [pl.BlockSpec((None, None, None, bk, bv), lambda r, h, i, j, c, *t: (r, h, rev(c), i, j))]
    out_shape = [jax.ShapeDtypeStruct((cfg.R, cfg.H, NT, cfg.K, cfg.V), F32)]
    if cfg.has_h0:
        out_specs.append(state_spec)
        out_shape.append(jax.ShapeDtypeStruct((cfg.N, cfg.H, cfg.K, cfg.V), F32))
    out = pl.pallas_call(
        functools.partial(_bwd_dh_kernel, scale=cfg.scale, NT=NT, has_h0=cfg.has_h0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3, grid=(cfg.R, cfg.H, cfg.nk, cfg.nv, NT), in_specs=in_specs,
            out_specs=out_specs, scratch_shapes=[pltpu.VMEM((bk, bv), F32)]),
        out_shape=out_shape,
        compiler_params=params("parallel", "parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(), name="simple_gla_chunk_bwd_dh",
    )(*cfg.prefetch(), q, do, b.reshape(cfg.R, cfg.H, NT * C, 1), b.reshape(cfg.R, cfg.H, NT, 1, C), dht)
    return (out[0], out[1]) if cfg.has_h0 else (out[0], None)


def _bwd_dv_kernel(q_ref, k_ref, do_ref, dh_ref, bcol_ref, brow_ref, dv_ref, acc_kq, acc_dv, *, scale, nk):
    """dv_j = scale * sum_{i>=j} exp(b_i - b_j) (q_i.k_j) do_i + exp(b_C - b_j) k_j dh; K tiles on axis 4."""
    i = pl.program_id(4)
    b_col, b_row = bcol_ref[...], brow_ref[...]
    _, decay_to_end = _decay_to_end(b_col, b_row)
    kq = dot(k_ref[...], q_ref[...], trans_b=True)
    kdh = dot(k_ref[...] * decay_to_end, dh_ref[...])

    @pl.when(i == 0)
    def _():
        acc_kq[...], acc_dv[...] = kq, kdh

    @pl.when(i > 0)
    def _():
        acc_kq[...] += kq
        acc_dv[...] += kdh

    @pl.when(i == nk - 1)
    def _():
        scores_t = acc_kq[...] * _intra_decay(b_col, b_row, transpose=True, backward=True) * scale
        dv_ref[...] = (dot(scores_t, do_ref[...]) + acc_dv[...]).astype(dv_ref.dtype)


def chunk_bwd_dv(q, k, do, dh, b, cfg: Config, dtype):
    C, bk, bv = cfg.C, cfg.bk, cfg.bv
    return pl.pallas_call(
        functools.partial(_bwd_dv_kernel, scale=cfg.scale, nk=cfg.nk),
        grid=(cfg.R, cfg.H, cfg.NT, cfg.nv, cfg.nk),
        in_specs=[pl.BlockSpec((None, None, C, bk), lambda r, h, c, j, i: (r, h, c, i)),
                  pl.BlockSpec((None, None, C, bk), lambda r, h, c, j, i: (r, h, c, i)),
                  pl.BlockSpec((None, None, C, bv), lambda r, h, c, j, i: (r, h, c, j)),
                  pl.BlockSpec((None, None, None, bk, bv), lambda r, h, c, j, i: (r, h, c, i, j)),
                  pl.BlockSpec((None, None, C, 1), lambda r, h, c, j, i: (r, h, c, 0)),
                  pl.BlockSpec((None, None, None, 1, C), lambda r, h, c, j, i: (r, h, c, 0, 0))],
        out_specs=pl.BlockSpec((None, None, C, bv), lambda r, h, c, j, i: (r, h, c, j)),
        out_shape=jax.ShapeDtypeStruct(do.shape, dtype),
        scratch_shapes=[pltpu.VMEM((C, C), F32), pltpu.VMEM((C, bv), F32)],
        compiler_params=params("parallel", "parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(), name="simple_gla_chunk_bwd_dv",
    )(q, k, do, dh, b.reshape(cfg.R, cfg.H, cfg.NT * C, 1), b.reshape(cfg.R, cfg.H, cfg.NT, 1, C))


def _bwd_dqk_kernel(q_ref, k_ref, v_ref, do_ref, h_ref, dh_ref, bcol_ref, brow_ref, dq_ref, dk_ref, db_ref,
                    acc_dov, acc_dq, acc_dk, acc_hdh, *, scale, nv):
    """dq, dk for one chunk and K tile, and that tile's share of db; V tiles accumulate on axis 4."""
    j = pl.program_id(4)
    do, v, h, dh = do_ref[...], v_ref[...], h_ref[...], dh_ref[...]
    parts = (dot(do, v, trans_b=True), dot(do, h, trans_b=True), dot(v, dh, trans_b=True), total(h * dh))
    accs = (acc_dov, acc_dq, acc_dk, acc_hdh)

    @pl.when(j == 0)
    def _():
        for acc, part in zip(accs, parts):
            acc[...] = part

    @pl.when(j > 0)
    def _():
        for acc, part in zip(accs, parts):
            acc[...] += part

    @pl.when(j == nv - 1)
    def _():
        q, k = q_ref[...], k_ref[...]
        b_col, b_row = bcol_ref[...], brow_ref[...]
        decay_all, decay_to_end = _decay_to_end(b_col, b_row)
        dscores = acc_dov[...] * _intra_decay(b_col, b_row, backward=True) * scale
        dq = dot(dscores, k) + (scale * jnp.exp(b_col)) * acc_dq[...]
        dk_inter = decay_to_end * acc_dk[...]
        dk = dot(dscores, q, trans_a=True) + dk_inter
        q32, k32 = q.astype(F32), k.astype(F32)
        C = q.shape[0]
        at_end = jax.lax.broadcasted_iota(jnp.int32, (C, 1), 0) == C - 1
        end_term = decay_all * acc_hdh[...] + total(k32 * dk_inter)
        db_ref[...] = row_sum(q32 * dq - k32 * dk) + jnp.where(at_end, end_term, 0.0)
        dq_ref[...] = dq.astype(dq_ref.dtype)
        dk_ref[...] = dk.astype(dk_ref.dtype)


def chunk_bwd_dqk(q, k, v, do, h, dh, b, cfg: Config):
    """dq, dk [R, H, S, K] in q's dtype and db [R, H, NT, C] float32."""
    C, bk, bv = cfg.C, cfg.bk, cfg.bv
    S = cfg.NT * C
    dq, dk, db = pl.pallas_call(
        functools.partial(_bwd_dqk_kernel, scale=cfg.scale, nv=cfg.nv),
        grid=(cfg.R, cfg.H, cfg.NT, cfg.nk, cfg.nv),
        in_specs=[pl.BlockSpec((None, None, C, bk), lambda r, h, c, i, j: (r, h, c, i)),
                  pl.BlockSpec((None, None, C, bk), lambda r, h, c, i, j: (r, h, c, i)),
                  pl.BlockSpec((None, None, C, bv), lambda r, h, c, i, j: (r, h, c, j)),
                  pl.BlockSpec((None, None, C, bv), lambda r, h, c, i, j: (r, h, c, j)),
                  pl.BlockSpec((None, None, None, bk, bv), lambda r, h, c, i, j: (r, h, c, i, j)),
                  pl.BlockSpec((None, None, None, bk, bv), lambda r, h, c, i, j: (r, h, c, i, j)),
                  pl.BlockSpec((None, None, C, 1), lambda r, h, c, i, j: (r, h, c, 0)),
                  pl.BlockSpec((None, None, None, 1, C), lambda r, h, c, i, j: (r, h, c, 0, 0))],
        out_specs=[pl.BlockSpec((None, None, C, bk), lambda r, h, c, i, j: (r, h, c, i)),
                   pl.BlockSpec((None, None, C, bk), lambda r, h, c, i, j: (r, h, c, i)),
                   pl.BlockSpec((None, None, None, C, 1), lambda r, h, c, i, j: (r, h, i, c, 0))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct((cfg.R, cfg.H, cfg.nk, S, 1), F32)],
        scratch_shapes=[pltpu.VMEM((C, C), F32), pltpu.VMEM((C, bk), F32), pltpu.VMEM((C, bk), F32),
                        pltpu.VMEM((1, 1), F32)],
        compiler_params=params("parallel", "parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret_mode(), name="simple_gla_chunk_bwd_dqk",
    )(q, k, v, do, h, dh, b.reshape(cfg.R, cfg.H, S, 1), b.reshape(cfg.R, cfg.H, cfg.NT, 1, C))
    return dq, dk, db.sum(axis=2).reshape(cfg.R, cfg.H, cfg.NT, C)


# ---------------------------------------------------------------------------------------------
# custom_vjp over the chunked layout


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def chunk_core(q, k, v, b, h0, cfg: Config):
    """(o [R, H, S, V], ht [N, H, K, V] float32) on the chunked layout; b [R, H, NT, C]."""
    return _core_fwd(q, k, v, b, h0, cfg)[0]


def _core_fwd(q, k, v, b, h0, cfg):
    h, ht = chunk_fwd_h(k, v, b, h0, cfg)
    o = chunk_fwd_o(q, k, v, h, b, cfg)
    return (o, ht), (q, k, v, b, h, h0)


def _core_bwd(cfg, res, cot):
    q, k, v, b, h, h0 = res
    do, dht = cot
    do = do.astype(q.dtype)
    dh, dh0 = chunk_bwd_dh(q, do, b, dht.astype(F32), cfg)
    dv = chunk_bwd_dv(q, k, do, dh, b, cfg, v.dtype)
    dq, dk, db = chunk_bwd_dqk(q, k, v, do, h, dh, b, cfg)
    return dq, dk, dv, db, (None if h0 is None else dh0.astype(h0.dtype))


chunk_core.defvjp(_core_fwd, _core_bwd)


# ---------------------------------------------------------------------------------------------
# public entry point


def prepare(q, k, v, g, g_gamma, scale, initial_state, cu_seqlens, chunk_size, *, require_gamma=False):
    """Validate FLA-convention inputs; (layout, scale). ValueError naming the argument on bad input."""
    B, T, H, K, V = validation.check_qkv(q, k, v)
    C = validation.check_chunk_size(chunk_size)
    if g is not None and g_gamma is not None:
        raise ValueError("g and g_gamma: give one gate, not both")
    if require_gamma and g_gamma is None:
        raise ValueError("g_gamma is required: the fused path supports per-head g_gamma gating only")
    if g is not None:
        validation.check_float("g", g, (B, T, H))
    if g_gamma is not None:
        validation.check_float("g_gamma", g_gamma, (H,))
        validation.check_nonpositive("g_gamma", g_gamma)
    cu = validation.check_cu_seqlens(cu_seqlens, B, T)
    layout = chunking.plan(B, T, C, cu)
    if initial_state is not None:
        validation.check_float("initial_state", initial_state, (layout.N, H, K, V))
    return layout, validation.check_scale(scale, K, V)


def chunk_log_decay(g, g_gamma, layout: chunking.ChunkLayout, H: int):
    """b [R, H, NT, C] float32: chunk-local cumulative log-decay (0 over padding slots' steps)."""
    R, NT, C = layout.rows, layout.NT, layout.C
    if g is not None:
        gc = chunking.to_chunks(g.astype(F32)[..., None], layout)[..., 0]
        return jnp.cumsum(gc.reshape(R, H, NT, C), axis=-1)
    if g_gamma is not None:
        pos = jnp.asarray(layout.positions())
        return jnp.broadcast_to(g_gamma.astype(F32)[None, :, None, None] * pos, (R, H, NT, C))
    return jnp.zeros((R, H, NT, C), F32)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, chunk_size=64):
    """Simple GLA, chunked Pallas kernels (FLA's chunk_simple_gla convention).

    q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] or g_gamma [H] (log-decays <= 0, float32);
    initial_state [N, H, K, V]; cu_seqlens [N + 1] (B == 1). Returns o [B, T, H, V] in q's dtype
    and the final state [N, H, K, V] float32 (None unless output_final_state).
    Differentiable w.r.t. q, k, v, g or g_gamma and initial_state."""
    layout, scale = prepare(q, k, v, g, g_gamma, scale, initial_state, cu_seqlens, chunk_size)
    B, T, H, K = q.shape
    cfg = Config(R=layout.rows, H=H, K=K, V=v.shape[-1], C=layout.C, NT=layout.NT, N=layout.N, scale=scale,
                 tables=(layout.seq, layout.first, layout.last), has_h0=initial_state is not None)
    o, ht = _chunked(q, k, v, g, g_gamma, initial_state, layout, cfg)
    return o, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(6, 7))
def _chunked(q, k, v, g, g_gamma, initial_state, layout, cfg):
    """Re-layout, gate cumsum and the kernels, compiled as one program."""
    b = chunk_log_decay(g, g_gamma, layout, cfg.H)
    qc, kc, vc = (chunking.to_chunks(x, layout) for x in (q, k, v))
    o, ht = chunk_core(qc, kc, vc, b, initial_state, cfg)
    return chunking.from_chunks(o, layout), ht
