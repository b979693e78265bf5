"""GDN's chunk stages as Pallas TPU kernels, one pallas_call per FLA stage function: the op's kernels
(chunk.py calls them in FLA's order) and its stage cases' (stages.py adapts FLA's calling
convention to them).

Layout (kernels_jax/common/layout.py): tokens packed per head, chunk aligned, P = NT * C slots:
q, k [H, P, K] (value head h reads q, k head h // G through their index maps: FLA's grouped value
heads, HV = G * H); w, dq, dk, dw [HV, P, K] (dq, dk per value head); v, u, v_new, o, do, dv,
dv2 [HV, P, V]; beta, db, dg [HV, P, 1]; A [HV, P, C] (row: slot, column: position in the chunk);
states h, dh [HV, NT, K, V]; h0, ht, dht, dh0 [N, HV, K, V].
Gates: b [HV, P, 1] FLA's chunk-local cumulative log-decay in log2 units, as the stages get it,
also passed as rows [HV, NT, 1, C]; a padding slot repeats its chunk's last real value (the
chunk's decay is read from its last slot), and has k = q = v = beta = 0. Every decay is
exp(ln 2 * (exponent difference)): the difference of two log2 cumsums is taken first, then
scaled (kernel_math.causal_decay's gamma), so no float32 rounding of a large b * ln 2 enters it.
Gradients w.r.t. the gate (dg, dg2) are w.r.t. the natural-log cumsum b * ln 2, as FLA's.
Per chunk (E_ij = exp2(b_i - b_j), masked before exp: kernel_math.causal_decay):
    fwd_intra      (HV, NT) parallel
        M = strict_lower(beta_i (k_i . k_j) E_ij), A = (I + M)^-1 (forward substitution),
        w = A (beta exp2(b) k), u = A (beta v)
    fwd_h          (HV, NT) sequential, S [K, V] in VMEM scratch
        v_new = u - w S, S <- exp2(b_L) S + (k exp2(b_L - b))^T v_new
    fwd_o          (HV, NT) parallel: o = scale (exp2(b) q S + (q k^T * E) v_new)
    bwd_dv_local   (HV, NT) parallel: dv = (scale q k^T * E)^T do
    bwd_dhu        (HV, NT) reversed, dS [K, V] in VMEM scratch
        dv2 = dv + (k exp2(b_L - b)) dS, dS <- exp2(b_L) dS + scale (q exp2(b))^T do - w^T dv2
    bwd_dqkwg      (HV, NT) parallel: dq, dk, dw = -dv2 S^T, dg (no cancelling diagonal pairs)
    bwd_wy         (HV, NT) parallel: dk2, dv, db, dg2 through w = A X, u = A Y at the given A
Everything accumulates in float32 (inputs upcast in VMEM); outputs are cast to their dtypes.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common.config import KernelConfig
from kernels_jax.common.kernel_math import F32, advance_state, causal_decay, dot, params, row_sum
from kernels_jax.common.platform import interpret_mode
from kernels_jax.kda.chunk_math import causal_mask, iota, unit_lower_inverse

LN2 = math.log(2.0)


def _f32(ref):
    return ref[...].astype(F32)


def _col_sum(x):
    """sum over rows of x [C, C] as a column [C, 1] (x^T 1)."""
    return dot(x, jnp.ones((x.shape[0], 1), F32), trans_a=True)


def _chunk_decays(b_col, b_row):
    """(exp2(b) [C, 1], exp2(b_L) [1, 1], exp2(b_L - b) [C, 1]) of a chunk, b_L its last slot's
    (log2 units; each exponent difference taken before its ln 2 factor)."""
    b_last = b_row[:, -1:]
    return jnp.exp(LN2 * b_col), jnp.exp(LN2 * b_last), jnp.exp(LN2 * (b_last - b_col))


class _Specs:
    """BlockSpecs of one (value head, chunk) grid step; `chunk` maps the grid's chunk index to the
    chunk (identity, or reversed for the backward recurrence); n_prefetch scalar tables first."""

    def __init__(self, cfg: KernelConfig, chunk=lambda c: c):
        self.cfg, self.chunk = cfg, chunk

    def rows(self, d: int):
        return pl.BlockSpec((None, self.cfg.C, d), lambda h, c, *t: (h, self.chunk(c), 0))

    def qk_rows(self):
        """q or k [C, K] of value head h: the rows of q, k head h // G (KernelConfig.qk_head)."""
        cfg = self.cfg
        return pl.BlockSpec((None, cfg.C, cfg.K), lambda h, c, *t: (cfg.qk_head(h), self.chunk(c), 0))

    def brow(self):
        return pl.BlockSpec((None, None, 1, self.cfg.C), lambda h, c, *t: (h, self.chunk(c), 0, 0))

    def state(self):
        return pl.BlockSpec((None, None, self.cfg.K, self.cfg.V), lambda h, c, *t: (h, self.chunk(c), 0, 0))

    def per_seq(self):
        return pl.BlockSpec((None, None, self.cfg.K, self.cfg.V), lambda h, c, seq, *t: (seq[self.chunk(c)], h, 0, 0))


def _gates(b, cfg: KernelConfig):
    """b [HV, P, 1] -> (b, its rows [HV, NT, 1, C])."""
    return b, b.reshape(cfg.HV, cfg.NT, 1, cfg.C)


def _call(kernel, name, cfg, in_specs, out_specs, out_shape, semantics, *, tables=(), scratch=()):
    """pl.pallas_call over the (HV, NT) grid, with scalar-prefetch tables when given."""
    grid = (cfg.HV, cfg.NT)
    if tables:
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(tables),
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=list(scratch),
        )
        kw = dict(grid_spec=spec)
    else:
        kw = dict(grid=grid, in_specs=in_specs, out_specs=out_specs, scratch_shapes=list(scratch))
    call = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        compiler_params=params(*semantics),
        interpret=interpret_mode(),
        name=f"gdn_chunk_{name}",
        **kw,
    )
    return lambda *args: call(*tables, *args)


# ---------------------------------------------------------------------------------------------
# fwd_intra


def _intra_kernel(k_ref, v_ref, beta_ref, bcol_ref, brow_ref, w_ref, u_ref, A_ref):
    """k, w [C, K]; v, u [C, V]; beta, b_col [C, 1]; b_row [1, C]; A [C, C]."""
    k, v, beta, b_col = _f32(k_ref), _f32(v_ref), beta_ref[...], bcol_ref[...]
    kk = dot(k, k, trans_b=True)
    E = causal_decay(b_col, brow_ref[...], gamma=LN2)
    M = jnp.where(causal_mask(k.shape[0], strict=True), beta * kk * E, 0.0)
    A = unit_lower_inverse(M)
    A_ref[...] = A.astype(A_ref.dtype)
    w_ref[...] = dot(A, k * (beta * jnp.exp(LN2 * b_col))).astype(w_ref.dtype)
    u_ref[...] = dot(A, v * beta).astype(u_ref.dtype)


def fwd_intra(k, v, beta, b, cfg: KernelConfig, dtype=None):
    """k [H, P, K], v [HV, P, V], beta, b [HV, P, 1] -> w [HV, P, K], u [HV, P, V], A [HV, P, C] in
    dtype (default: w, A in k's, u in v's)."""
    s, (bc, br) = _Specs(cfg), _gates(b, cfg)
    K, V, C, HV, P = cfg.K, cfg.V, cfg.C, cfg.HV, cfg.slots
    out_shape = [
        jax.ShapeDtypeStruct((HV, P, K), dtype or k.dtype),
        jax.ShapeDtypeStruct((HV, P, V), dtype or v.dtype),
        jax.ShapeDtypeStruct((HV, P, C), dtype or k.dtype),
    ]
    in_specs = [s.qk_rows(), s.rows(V), s.rows(1), s.rows(1), s.brow()]
    out_specs = [s.rows(K), s.rows(V), s.rows(C)]
    call = _call(_intra_kernel, "fwd_intra", cfg, in_specs, out_specs, out_shape, ("parallel", "parallel"))
    return call(k, v, beta, bc, br)


# ---------------------------------------------------------------------------------------------
# fwd_h


def _fwd_h_kernel(seq_ref, first_ref, last_ref, k_ref, w_ref, u_ref, bcol_ref, brow_ref, *rest, has_h0):
    """k, w [C, K]; u, v_new [C, V]; h0, h, ht [K, V]; scratch S [K, V]."""
    h0_ref, (h_ref, vn_ref, ht_ref, S_ref) = (rest[0], rest[1:]) if has_h0 else (None, rest)
    c = pl.program_id(1)

    @pl.when(first_ref[c] == 1)
    def load_initial_state():
        S_ref[...] = h0_ref[...].astype(F32) if has_h0 else jnp.zeros(S_ref.shape, F32)

    S = S_ref[...]
    h_ref[...] = S.astype(h_ref.dtype)
    _, decay_all, decay_to_end = _chunk_decays(bcol_ref[...], brow_ref[...])
    vn = _f32(u_ref) - dot(_f32(w_ref), S)
    vn_ref[...] = vn.astype(vn_ref.dtype)
    S = advance_state(S, _f32(k_ref), vn, decay_all, decay_to_end)
    S_ref[...] = S

    @pl.when(last_ref[c] == 1)
    def emit_final_state():
        ht_ref[...] = S


def fwd_h(k, w, u, b, h0, tables, cfg: KernelConfig, h_dtype=None):
    """k [H, P, K], w [HV, P, K], u [HV, P, V], b [HV, P, 1], h0 [N, HV, K, V] or None, tables (seq,
    first, last) -> h [HV, NT, K, V] in h_dtype (default k's; the state before each chunk), v_new
    [HV, P, V] in u's dtype, ht [N, HV, K, V] float32."""
    s, (bc, br) = _Specs(cfg), _gates(b, cfg)
    K, V, HV, NT, N, P = cfg.K, cfg.V, cfg.HV, cfg.NT, cfg.N, cfg.slots
    in_specs = [s.qk_rows(), s.rows(K), s.rows(V), s.rows(1), s.brow()]
    args = [k, w, u, bc, br]
    if cfg.has_h0:
        in_specs.append(s.per_seq())
        args.append(h0)
    out_shape = [
        jax.ShapeDtypeStruct((HV, NT, K, V), h_dtype or k.dtype),
        jax.ShapeDtypeStruct((HV, P, V), u.dtype),
        jax.ShapeDtypeStruct((N, HV, K, V), F32),
    ]
    kernel = functools.partial(_fwd_h_kernel, has_h0=cfg.has_h0)
    call = _call(
        kernel,
        "fwd_h",
        cfg,
        in_specs,
        [s.state(), s.rows(V), s.per_seq()],
        out_shape,
        ("parallel", "arbitrary"),
        tables=tables,
        scratch=[pltpu.VMEM((K, V), F32)],
    )
    return call(*args)


# ---------------------------------------------------------------------------------------------
# fwd_o, bwd_dv_local


def _fwd_o_kernel(q_ref, k_ref, v_ref, h_ref, bcol_ref, brow_ref, o_ref, *, scale):
    """q, k [C, K]; v (v_new), o [C, V]; h [K, V]."""
    q, b_col = _f32(q_ref), bcol_ref[...]
    scores = dot(q, _f32(k_ref), trans_b=True) * causal_decay(b_col, brow_ref[...], gamma=LN2)
    o = scale * (jnp.exp(LN2 * b_col) * dot(q, _f32(h_ref)) + dot(scores, _f32(v_ref)))
    o_ref[...] = o.astype(o_ref.dtype)


def fwd_o(q, k, v, h, b, cfg: KernelConfig, o_dtype=None):
    """q, k [H, P, K], v (v_new) [HV, P, V], h [HV, NT, K, V], b [HV, P, 1] -> o [HV, P, V] in
    o_dtype (default v's)."""
    s, (bc, br) = _Specs(cfg), _gates(b, cfg)
    V = cfg.V
    kernel = functools.partial(_fwd_o_kernel, scale=cfg.scale)
    in_specs = [s.qk_rows(), s.qk_rows(), s.rows(V), s.state(), s.rows(1), s.brow()]
    out_shape = jax.ShapeDtypeStruct(v.shape, o_dtype or v.dtype)
    return _call(kernel, "fwd_o", cfg, in_specs, s.rows(V), out_shape, ("parallel", "parallel"))(q, k, v, h, bc, br)


def _dv_local_kernel(q_ref, k_ref, do_ref, bcol_ref, brow_ref, dv_ref, *, scale):
    """q, k [C, K]; do, dv [C, V]: dv_j = scale sum_{i>=j} E_ij (q_i . k_j) do_i."""
    scores_t = dot(_f32(k_ref), _f32(q_ref), trans_b=True) * causal_decay(
        bcol_ref[...], brow_ref[...], transpose=True, gamma=LN2
    )
    dv_ref[...] = (scale * dot(scores_t, _f32(do_ref))).astype(dv_ref.dtype)


def bwd_dv_local(q, k, do, b, cfg: KernelConfig, dv_dtype=None):
    """q, k [H, P, K], do [HV, P, V], b [HV, P, 1] -> dv [HV, P, V] in dv_dtype (default do's)."""
    s, (bc, br) = _Specs(cfg), _gates(b, cfg)
    V = cfg.V
    kernel = functools.partial(_dv_local_kernel, scale=cfg.scale)
    in_specs = [s.qk_rows(), s.qk_rows(), s.rows(V), s.rows(1), s.brow()]
    out_shape = jax.ShapeDtypeStruct(do.shape, dv_dtype or do.dtype)
    return _call(kernel, "bwd_dv_local", cfg, in_specs, s.rows(V), out_shape, ("parallel", "parallel"))(
        q, k, do, bc, br
    )


# ---------------------------------------------------------------------------------------------
# bwd_dhu


def _bwd_dhu_kernel(
    seq_ref,
    first_ref,
    last_ref,
    q_ref,
    k_ref,
    w_ref,
    do_ref,
    dv_ref,
    bcol_ref,
    brow_ref,
    dht_ref,
    *rest,
    scale,
    NT,
    has_h0,
):
    """q, k, w [C, K]; do, dv, dv2 [C, V]; dht, dh, dh0 [K, V]; scratch dS [K, V] (the gradient
    w.r.t. the state after the chunk)."""
    if has_h0:
        dh_ref, dv2_ref, dh0_ref, dS_ref = rest
    else:
        (dh_ref, dv2_ref, dS_ref), dh0_ref = rest, None
    c = NT - 1 - pl.program_id(1)

    @pl.when(last_ref[c] == 1)
    def load_final_state_grad():
        dS_ref[...] = dht_ref[...].astype(F32)

    dS = dS_ref[...]
    dh_ref[...] = dS.astype(dh_ref.dtype)
    decay, decay_all, decay_to_end = _chunk_decays(bcol_ref[...], brow_ref[...])
    dv2 = _f32(dv_ref) + dot(_f32(k_ref) * decay_to_end, dS)
    dv2_ref[...] = dv2.astype(dv2_ref.dtype)
    qd = _f32(q_ref) * (scale * decay)
    dS = decay_all * dS + dot(qd, _f32(do_ref), trans_a=True) - dot(_f32(w_ref), dv2, trans_a=True)
    dS_ref[...] = dS

    if has_h0:

        @pl.when(first_ref[c] == 1)
        def emit_initial_state_grad():
            dh0_ref[...] = dS


def bwd_dhu(q, k, w, do, dv, b, dht, tables, cfg: KernelConfig, dh_dtype=None):
    """q, k [H, P, K], w [HV, P, K], do, dv [HV, P, V], b [HV, P, 1], dht [N, HV, K, V] (zeros: none)
    -> dh [HV, NT, K, V] in dh_dtype (default q's), dv2 [HV, P, V] in dv's dtype, dh0 [N, HV, K, V]
    float32 (or None without h0)."""
    NT, K, V, HV, N = cfg.NT, cfg.K, cfg.V, cfg.HV, cfg.N
    s, (bc, br) = _Specs(cfg, chunk=lambda c: NT - 1 - c), _gates(b, cfg)
    in_specs = [s.qk_rows(), s.qk_rows(), s.rows(K), s.rows(V), s.rows(V), s.rows(1), s.brow(), s.per_seq()]
    out_specs = [s.state(), s.rows(V)]
    out_shape = [jax.ShapeDtypeStruct((HV, NT, K, V), dh_dtype or q.dtype), jax.ShapeDtypeStruct(dv.shape, dv.dtype)]
    if cfg.has_h0:
        out_specs.append(s.per_seq())
        out_shape.append(jax.ShapeDtypeStruct((N, HV, K, V), F32))
    kernel = functools.partial(_bwd_dhu_kernel, scale=cfg.scale, NT=NT, has_h0=cfg.has_h0)
    call = _call(
        kernel,
        "bwd_dhu",
        cfg,
        in_specs,
        out_specs,
        out_shape,
        ("parallel", "arbitrary"),
        tables=tables,
        scratch=[pltpu.VMEM((K, V), F32)],
    )
    out = call(q, k, w, do, dv, bc, br, dht)
    return (out[0], out[1], out[2]) if cfg.has_h0 else (out[0], out[1], None)


# ---------------------------------------------------------------------------------------------
# bwd_dqkwg


def _dqkwg_kernel(
    length_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    dv_ref,
    h_ref,
    dh_ref,
    bcol_ref,
    brow_ref,
    dq_ref,
    dk_ref,
    dw_ref,
    dg_ref,
    *,
    scale,
):
    """q, k, dq, dk, dw [C, K]; v (v_new), do, dv (dv2) [C, V]; h, dh [K, V]; dg [C, 1]: the
    gradient w.r.t. the natural-log cumsum b ln 2 (terms of the pairs across each slot, the cancelling
    diagonal pairs left out; the chunk's end terms on its last real slot)."""
    c = pl.program_id(1)
    q, k, v, do, h, dh = (_f32(r) for r in (q_ref, k_ref, v_ref, do_ref, h_ref, dh_ref))
    b_col, b_row = bcol_ref[...], brow_ref[...]
    decay, decay_all, decay_to_end = _chunk_decays(b_col, b_row)
    ds = scale * dot(do, v, trans_b=True) * causal_decay(b_col, b_row, gamma=LN2)
    dq_state = (scale * decay) * dot(do, h, trans_b=True)
    dk_state = decay_to_end * dot(v, dh, trans_b=True)
    dq_ref[...] = dq_state + dot(ds, k)
    dk_ref[...] = dk_state + dot(ds, q, trans_a=True)
    dw_ref[...] = (-dot(_f32(dv_ref), h, trans_b=True)).astype(dw_ref.dtype)
    C = q.shape[0]
    M = jnp.where(causal_mask(C, strict=True), ds * dot(q, k, trans_b=True), 0.0)
    wt = row_sum(k * dk_state)
    end = decay_all * jnp.sum(row_sum(h * dh), axis=0, keepdims=True) + jnp.sum(wt, axis=0, keepdims=True)
    at_end = iota((C, 1), 0) == length_ref[c] - 1
    dg_ref[...] = row_sum(q * dq_state) + row_sum(M) - _col_sum(M) - wt + jnp.where(at_end, end, 0.0)


def bwd_dqkwg(q, k, v, do, dv, h, dh, b, length, cfg: KernelConfig, w_dtype):
    """q, k [H, P, K], v (v_new), do, dv (dv2) [HV, P, V], h, dh [HV, NT, K, V], b [HV, P, 1],
    length int32 [NT] (real slots per chunk) -> dq, dk [HV, P, K] float32 (per value head),
    dw [HV, P, K] in w_dtype, dg [HV, P, 1] float32."""
    s, (bc, br) = _Specs(cfg), _gates(b, cfg)
    K, V, HV, P = cfg.K, cfg.V, cfg.HV, cfg.slots
    in_specs = [s.qk_rows(), s.qk_rows(), s.rows(V), s.rows(V), s.rows(V), s.state(), s.state(), s.rows(1), s.brow()]
    out_shape = [
        jax.ShapeDtypeStruct((HV, P, K), F32),
        jax.ShapeDtypeStruct((HV, P, K), F32),
        jax.ShapeDtypeStruct((HV, P, K), w_dtype),
        jax.ShapeDtypeStruct((HV, P, 1), F32),
    ]
    kernel = functools.partial(_dqkwg_kernel, scale=cfg.scale)
    out_specs = [s.rows(K), s.rows(K), s.rows(K), s.rows(1)]
    call = _call(kernel, "bwd_dqkwg", cfg, in_specs, out_specs, out_shape, ("parallel", "parallel"), tables=(length,))
    return call(q, k, v, do, dv, h, dh, bc, br)


# ---------------------------------------------------------------------------------------------
# bwd_wy


def _wy_kernel(k_ref, v_ref, beta_ref, A_ref, dw_ref, du_ref, bcol_ref, brow_ref, dk_ref, dv_ref, db_ref, dg_ref):
    """k, dw, dk [C, K]; v, du, dv [C, V]; beta, db, dg [C, 1]; A [C, C]: the gradients of
    <dw, w> + <du, u> through w = A X, u = A Y (X = beta exp2(b) k, Y = beta v) and A = (I + M)^-1
    (dM = -A^T dA A^T), M_ij = beta_i (k_i . k_j) E_ij."""
    k, v, A, dw, du = (_f32(r) for r in (k_ref, v_ref, A_ref, dw_ref, du_ref))
    beta, b_col = beta_ref[...], bcol_ref[...]
    C = k.shape[0]
    strict = causal_mask(C, strict=True)
    eb = jnp.exp(LN2 * b_col)
    X, Y = k * (beta * eb), v * beta
    dX, dY = dot(A, dw, trans_a=True), dot(A, du, trans_a=True)
    dA = jnp.where(strict, dot(dw, X, trans_b=True) + dot(du, Y, trans_b=True), 0.0)
    dM = -dot(dot(A, dA, trans_a=True), A, trans_b=True)
    dKb = jnp.where(strict, dM * causal_decay(b_col, brow_ref[...], gamma=LN2), 0.0)  # w.r.t. beta_i (k_i . k_j)
    kk = dot(k, k, trans_b=True)
    dKbb = dKb * beta
    dk_ref[...] = dX * (beta * eb) + dot(dKbb, k) + dot(dKbb, k, trans_a=True)
    dv_ref[...] = (dY * beta).astype(dv_ref.dtype)
    db_ref[...] = row_sum(dX * k) * eb + row_sum(dY * v) + row_sum(dKb * kk)
    Mv = dKbb * kk
    dg_ref[...] = row_sum(dX * X) + row_sum(Mv) - _col_sum(Mv)


def bwd_wy(k, v, beta, A, dw, du, b, cfg: KernelConfig):
    """k [H, P, K], dw [HV, P, K], v, du [HV, P, V], beta, b [HV, P, 1], A [HV, P, C] -> dk2 [HV, P, K]
    float32 (per value head), dv [HV, P, V] in v's dtype, db, dg2 [HV, P, 1] float32."""
    s, (bc, br) = _Specs(cfg), _gates(b, cfg)
    K, V, C, HV, P = cfg.K, cfg.V, cfg.C, cfg.HV, cfg.slots
    in_specs = [s.qk_rows(), s.rows(V), s.rows(1), s.rows(C), s.rows(K), s.rows(V), s.rows(1), s.brow()]
    out_shape = [
        jax.ShapeDtypeStruct((HV, P, K), F32),
        jax.ShapeDtypeStruct((HV, P, V), v.dtype),
        jax.ShapeDtypeStruct((HV, P, 1), F32),
        jax.ShapeDtypeStruct((HV, P, 1), F32),
    ]
    out_specs = [s.rows(K), s.rows(V), s.rows(1), s.rows(1)]
    call = _call(_wy_kernel, "bwd_wy", cfg, in_specs, out_specs, out_shape, ("parallel", "parallel"))
    return call(k, v, beta, A, dw, du, bc, br)
