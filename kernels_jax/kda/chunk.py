"""chunk_kda: Kimi Delta Attention by chunks, Pallas TPU kernels forward and backward.

Recurrence (references/kda.py), per sequence and head, state S [K, V]:
    S' = diag(exp(g_t)) S_{t-1};  S_t = S' + (beta_t k_t)^T (v_t - k_t S');  o_t = scale q_t S_t
q and k are used as given (callers L2-normalise them, as FLA's chunk_kda expects by default).

Chunked form, per chunk with chunk-start state S and G = chunk-local cumsum of g:
    W, U  = (I + diag(beta) A_kk)^-1 (beta k exp(G)), (...)^-1 (beta v)   (intra kernel)
    v_new = U - W S;  o = scale ((q exp(G)) S + A_qk v_new)
    S_end = diag(exp(G_last)) S + (k exp(G_last - G))^T v_new            (recurrence kernel)
Backward (jax.custom_vjp): recompute the forward factors and states, run the state gradient
backwards over chunks, then every per-chunk gradient in parallel (kernels.py).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernels_jax.common import validation
from kernels_jax.common.platform import interpret_mode

from . import kernels

CHUNK_SIZES = (16, 32, 64, 128)
MAX_DIM = 256


# ---------------------------------------------------------------- validation
def _check(cond: bool, name: str, msg: str):
    if not cond:
        raise ValueError(f"chunk_kda: {name} {msg}")


def _concrete(x):
    """x as numpy when its values are known now (not a tracer), else None."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def check_supported(K: int, V: int, dtype=None) -> None:
    """NoKernel unless the kernels tile K and V (multiples of 8 from 8 to 256) and take dtype
    (float32, bfloat16: no float16 on a TPU)."""
    validation.check_supported("kda", K, V, dtype, lambda d: d % 8 == 0 and 8 <= d <= MAX_DIM,
                               f"multiples of 8 from 8 to {MAX_DIM}", validation.TPU_DTYPES)


def _validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_size):
    _check(chunk_size in CHUNK_SIZES, "chunk_size", f"must be one of {CHUNK_SIZES}, got {chunk_size!r}")
    _check(getattr(q, "ndim", None) == 4, "q", f"must be [B, T, H, K], got shape {getattr(q, 'shape', None)}")
    B, T, H, K = q.shape
    _check(T >= 1 and B >= 1 and H >= 1, "q", f"has an empty dimension: {q.shape}")
    _check(getattr(k, "shape", None) == q.shape, "k", f"must have q's shape {q.shape}, got {getattr(k, 'shape', None)}")
    _check(getattr(v, "ndim", None) == 4 and v.shape[:3] == (B, T, H), "v",
           f"must be [B, T, H, V] = [{B}, {T}, {H}, V], got {getattr(v, 'shape', None)}")
    V = v.shape[-1]
    _check(g is not None and getattr(g, "shape", None) == (B, T, H, K), "g",
           f"must be [B, T, H, K] = {(B, T, H, K)}, got {getattr(g, 'shape', None)}")
    _check(beta is not None and getattr(beta, "shape", None) == (B, T, H), "beta",
           f"must be [B, T, H] = {(B, T, H)}, got {getattr(beta, 'shape', None)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _check(jnp.issubdtype(x.dtype, jnp.floating), name, f"must be floating point, got {x.dtype}")
    _check(k.dtype == q.dtype and v.dtype == q.dtype, "k", f"and v must have q's dtype {q.dtype}, "
           f"got k {k.dtype}, v {v.dtype}")
    check_supported(K, V, q.dtype)
    if scale is not None:
        _check(isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0, "scale",
               f"must be a positive finite number or None, got {scale!r}")
    if cu_seqlens is not None:
        _check(B == 1, "cu_seqlens", f"requires batch size B == 1 (packed sequences), got B = {B}")
        _check(getattr(cu_seqlens, "ndim", None) == 1 and cu_seqlens.shape[0] >= 2, "cu_seqlens",
               f"must be 1-D [N + 1] with N >= 1, got shape {getattr(cu_seqlens, 'shape', None)}")
        _check(jnp.issubdtype(cu_seqlens.dtype, jnp.integer), "cu_seqlens",
               f"must be integer, got {cu_seqlens.dtype}")
        cu = _concrete(cu_seqlens)
        if cu is not None:
            _check(cu[0] == 0 and cu[-1] == T and bool(np.all(np.diff(cu) >= 0)), "cu_seqlens",
                   f"must be non-decreasing from 0 to T = {T}, got {cu.tolist()}")
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if initial_state is not None:
        _check(getattr(initial_state, "shape", None) == (N, H, K, V), "initial_state",
               f"must be [N, H, K, V] = {(N, H, K, V)}, got {getattr(initial_state, 'shape', None)}")
    return B, T, H, K, V, N


# ---------------------------------------------------------------- chunk-aligned packing
def _packing(cu, total_tokens: int, C: int):
    """Where each token goes when every sequence starts on a chunk boundary.

    cu [N + 1] (numpy when known, else a jnp array). Returns src [P] (token index of each
    padded row), valid [P], dst [total_tokens] (padded row of each token), chunk_seq [NT],
    chunk_flags [NT]; P = NT * C. Every sequence gets at least one chunk.
    """
    xp = np if isinstance(cu, np.ndarray) else jnp
    cu = cu.astype(xp.int32)
    N = cu.shape[0] - 1
    lens = cu[1:] - cu[:-1]
    n_chunks = xp.maximum(1, (lens + C - 1) // C)
    first_chunk = xp.concatenate([xp.zeros(1, xp.int32), xp.cumsum(n_chunks)[:-1].astype(xp.int32)])
    # static chunk count: exact when cu is known, else the bound sum(floor(len / C) + 1)
    NT = int(n_chunks.sum()) if xp is np else total_tokens // C + N
    chunk = xp.arange(NT, dtype=xp.int32)
    chunk_seq = xp.clip(xp.searchsorted(first_chunk, chunk, side="right") - 1, 0, N - 1).astype(xp.int32)
    is_first = chunk == first_chunk[chunk_seq]
    is_last = chunk == first_chunk[chunk_seq] + n_chunks[chunk_seq] - 1
    chunk_flags = (is_first * kernels.FIRST + is_last * kernels.LAST).astype(xp.int32)
    row = xp.arange(NT * C, dtype=xp.int32)
    row_seq = chunk_seq[row // C]
    offset = row - first_chunk[row_seq] * C
    valid = (offset < lens[row_seq]) & (row // C < first_chunk[-1] + n_chunks[-1])
    src = xp.where(valid, cu[row_seq] + offset, 0).astype(xp.int32)
    token = xp.arange(total_tokens, dtype=xp.int32)
    token_seq = xp.clip(xp.searchsorted(cu[1:], token, side="right"), 0, N - 1)
    dst = (first_chunk[token_seq] * C + token - cu[token_seq]).astype(xp.int32)
    return src, valid, dst, chunk_seq, chunk_flags


def _pack(x, src, valid):
    """x [B*T, H, ...] -> [H, P, ...] with padded rows zero."""
    rows = jnp.take(x, jnp.asarray(src), axis=0)
    mask = jnp.asarray(valid).reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.moveaxis(jnp.where(mask, rows, jnp.zeros((), x.dtype)), 1, 0)


def _unpack(y, dst):
    """y [H, P, D] -> [B*T, H, D]."""
    return jnp.take(jnp.moveaxis(y, 0, 1), jnp.asarray(dst), axis=0)


# ---------------------------------------------------------------- custom_vjp core
# The pipelines are jitted (compiled once per shape); `compiled` = interpret_mode() is False is a
# static argument so that a trace for TPU (compile_for_tpu) never reuses an interpret-mode trace.
_STATIC = ("scale", "chunk_size", "compiled")


@functools.partial(jax.jit, static_argnames=_STATIC + ("store_states",))
def _forward(q, k, v, g, beta, h0, chunk_seq, chunk_flags, *, scale, chunk_size, compiled, store_states):
    """-> o, v_new, h (or None), ht, (W, A_qk)."""
    W, U, A_qk = kernels.intra(q, k, v, g, beta, chunk_size=chunk_size)
    outs = kernels.recurrence_fwd(q, k, g, W, U, A_qk, h0, chunk_seq, chunk_flags, scale=scale,
                                  chunk_size=chunk_size, out_dtype=q.dtype, store_states=store_states)
    o, vn, h, ht = outs if store_states else (outs[0], outs[1], None, outs[2])
    return o, vn, h, ht, (W, A_qk)


@functools.partial(jax.jit, static_argnames=_STATIC)
def _backward(q, k, v, g, beta, chunk_seq, chunk_flags, W, A_qk, vn, h, do, dht, *, scale, chunk_size, compiled):
    """From the forward's factors and chunk states. -> dq, dk, dv, dg, dbeta, dh0 (float32)."""
    dvn, dh, dh0 = kernels.recurrence_bwd(q, k, g, W, A_qk, do, dht.astype(jnp.float32), chunk_seq,
                                          chunk_flags, scale=scale, chunk_size=chunk_size)
    dq, dk, dv, dg, dbeta = kernels.chunk_grads(q, k, v, g, beta, h, dh, vn, dvn, do, scale=scale,
                                                chunk_size=chunk_size)
    return dq, dk, dv, dg, dbeta, dh0


def _static(scale, chunk_size):
    return {"scale": scale, "chunk_size": chunk_size, "compiled": interpret_mode() is False}


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9))
def _kda_core(q, k, v, g, beta, h0, chunk_seq, chunk_flags, scale, chunk_size):
    """Packed layout (kernels.py). -> o [H, P, V] in q's dtype, ht [N, H, V, K] float32."""
    o, _, _, ht, _ = _forward(q, k, v, g, beta, h0, chunk_seq, chunk_flags, store_states=False,
                              **_static(scale, chunk_size))
    return o, ht


def _kda_core_fwd(q, k, v, g, beta, h0, chunk_seq, chunk_flags, scale, chunk_size):
    """Keeps the chunk factors W, A_qk, v_new and the chunk-start states h for the backward."""
    o, vn, h, ht, (W, A_qk) = _forward(q, k, v, g, beta, h0, chunk_seq, chunk_flags, store_states=True,
                                          **_static(scale, chunk_size))
    return (o, ht), (q, k, v, g, beta, chunk_seq, chunk_flags, W, A_qk, vn, h)


def _kda_core_bwd(scale, chunk_size, residuals, cotangents):
    q, k, v, g, beta, chunk_seq, chunk_flags, *saved = residuals
    do, dht = cotangents
    dq, dk, dv, dg, dbeta, dh0 = _backward(q, k, v, g, beta, chunk_seq, chunk_flags, *saved, do, dht,
                                           **_static(scale, chunk_size))
    # g, beta and h0 are float32 in the packed layout (chunk_kda casts them)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg, dbeta, dh0, None, None


_kda_core.defvjp(_kda_core_fwd, _kda_core_bwd)


# ---------------------------------------------------------------- public entry point
def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
              chunk_size=64):
    """Kimi Delta Attention, chunked (FLA's chunk_kda convention).

    q, k [B, T, H, K] (L2-normalised by the caller), v [B, T, H, V]; g [B, T, H, K] per-channel
    log-decay; beta [B, T, H]; initial_state [N, H, K, V] float32 (N = B, or the number of packed
    sequences with cu_seqlens [N + 1] and B == 1). Returns (o [B, T, H, V] in q's dtype,
    final_state [N, H, K, V] float32 or None).
    """
    B, T, H, K, V, N = _validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_size)
    scale = float(K ** -0.5 if scale is None else scale)
    C = chunk_size
    if cu_seqlens is None:
        cu = np.arange(B + 1, dtype=np.int32) * T
    else:
        cu = _concrete(cu_seqlens)
        cu = jnp.asarray(cu_seqlens) if cu is None else cu
    src, valid, dst, chunk_seq, chunk_flags = _packing(cu, B * T, C)

    flat = lambda x: x.reshape((B * T,) + x.shape[2:])
    qp, kp, vp = (_pack(flat(x), src, valid) for x in (q, k, v))
    gp = _pack(flat(g.astype(jnp.float32)), src, valid)
    betap = _pack(flat(beta.astype(jnp.float32))[..., None], src, valid)
    h0 = jnp.zeros((N, H, K, V), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    o, ht = _kda_core(qp, kp, vp, gp, betap, jnp.swapaxes(h0, -1, -2), jnp.asarray(chunk_seq),
                      jnp.asarray(chunk_flags), scale, C)
    o = _unpack(o, dst).reshape(B, T, H, V)
    return o, (jnp.swapaxes(ht, -1, -2) if output_final_state else None)
