"""GLA's chunk stages under FLA 0.6.0's names and keyword calling convention (cases/stages/gla.py).

Each stage runs one Pallas kernel of kernels.py, the op's own (chunk.py calls the same functions),
through a thin adapter that plans the layout on the host (kernels_jax/common/layout.py;
cu_seqlens must be concrete), packs FLA's [B, T, H, D] tensors
into the kernels' head-major chunk layout [H, NT * C, D] (head dims padded to multiples of
ALIGN), FLA's per-chunk squares A, dA [B, T, H, C] into [H, NT * C, C], and converts the results
back. chunk_local_cumsum is plain jnp (parity.model.kernels.XLA_STAGES).

Gates arrive in FLA 0.6.0's log2 units: g (gk) [B, T, H, K] is the chunk-local cumsum of the op's
log-decays times 1 / ln 2; the kernels take it as it is (exp2). A chunk's padding slots repeat
the chunk's last real gate (the kernels read the chunk's total from its last slot).

States: FLA's h, dh [B, NT, H, K, V] (NT chunks per row, or over all packed sequences with
B == 1; an empty sequence has none) <-> the kernels' [H, NT', K, V], rows or sequences packed in
order (an empty sequence has one chunk of padding there). Every function is jax.jit-compatible
for given static arguments (chunk_size, scale, output_final_state, a concrete cu_seqlens).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels_jax.common import stage_layout
from kernels_jax.common.config import KernelConfig, prepare
from kernels_jax.common.stage_layout import gate_slots, gate_sources, require_concrete, states_in, states_out

from . import kernels
from .kernels import ALIGN, F32

# ---------------------------------------------------------------------------------------------
# host-side planning


def _no(stage: str, **unsupported) -> None:
    """ValueError for arguments FLA's gla op never passes to the stage (set, or true)."""
    for name, value in unsupported.items():
        if value is not None and value is not False:
            raise ValueError(f"gla {stage}: {name} is not supported here (FLA's chunk_gla passes none)")


def _prepare(stage, x, y, *, g=None, scale=None, h0=None, cu_seqlens=None, chunk_size=64):
    """(layout, cfg, gate_src int32 [NT * C], keep int32 [NT_fla]) for one stage call; x: a
    [B, T, H, K] input (K), y: a [B, T, H, V] one (V), both of one dtype; g validated as gla's
    gate (a stage without g, bwd_dA, is planned as a gate-free simple_gla call).
    gate_src: the packed slot each slot's gate is read from (a padding slot reads its chunk's
    last real slot); keep: the kernels' chunks FLA counts (all but empty sequences' chunk)."""
    require_concrete(cu_seqlens, "gla", stage)
    layout, cfg = prepare(
        "gla" if g is not None else "simple_gla",
        x,
        x,
        y,
        align=ALIGN,
        g=g,
        scale=scale,
        initial_state=h0,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    gate_src, keep = gate_sources(layout)
    return layout, cfg, gate_src, keep


# ---------------------------------------------------------------------------------------------
# local_cumsum


def chunk_local_cumsum(g, chunk_size, reverse=False, scale=None, cu_seqlens=None, **unused):
    """g [B, T, H, K] (or [B, T, H]) -> [B, T, H, K] float32: the cumsum of g within each chunk
    (each sequence's chunks start at its first token; reversed: from each chunk's end), times
    scale when given. A compensated jnp scan on the packed layout (an XLA stage, not a Pallas kernel)."""
    return stage_layout.chunk_local_cumsum("gla", g, chunk_size, scale, reverse, cu_seqlens)


# ---------------------------------------------------------------------------------------------
# fwd_h


def chunk_fwd_h(
    k,
    v,
    g=None,
    g_gamma=None,
    gk=None,
    gv=None,
    h0=None,
    output_final_state=False,
    state_v_first=False,
    cu_seqlens=None,
    chunk_size=64,
    states_in_fp32=False,
    **unused,
):
    """k, gk [B, T, H, K] (gk: log2 chunk-local cumsum), v [B, T, H, V], h0 [N, H, K, V] ->
    (h [B, NT, H, K, V]: the state before each chunk, in k's dtype, float32 with states_in_fp32;
    ht [N, H, K, V] float32 or None unless output_final_state). Kernel: kernels.fwd_h."""
    _no("chunk_fwd_h", g=g, g_gamma=g_gamma, gv=gv, state_v_first=state_v_first)
    layout, cfg, gate_src, keep = _prepare(
        "chunk_fwd_h", k, v, g=gk, h0=h0, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    h_dtype = jnp.dtype(F32 if states_in_fp32 else k.dtype)
    h, ht = _fwd_h(k, v, gk, h0, layout, gate_src, keep, cfg, h_dtype)
    return h, (ht if output_final_state else None)


@functools.partial(jax.jit, static_argnums=(7, 8))
def _fwd_h(k, v, gk, h0, layout, gate_src, keep, cfg: KernelConfig, h_dtype):
    h0p = jnp.zeros((cfg.N, cfg.H, cfg.K, cfg.V), F32) if h0 is None else cfg.pad_state(h0)
    g = gate_slots(gk, layout, gate_src, cfg.K)
    h, ht = kernels.fwd_h(layout.pack(k, cfg.K), layout.pack(v, cfg.V), g, h0p, layout.tables(), cfg.NT, cfg.C)
    return states_out(h.astype(h_dtype), layout, keep, cfg), cfg.cut_state(ht)


# ---------------------------------------------------------------------------------------------
# fwd_intra


def chunk_gla_fwd_intra_gk(q, k, g, scale, cu_seqlens=None, chunk_size=64, **unused):
    """q, k, g [B, T, H, K] (g log2) -> A [B, T, H, C] float32: scale sum_k q_tk k_sk
    exp2(g_tk - g_sk) for s <= t (s, t positions in t's chunk), 0 above. Kernel:
    kernels.fwd_intra."""
    layout, cfg, gate_src, _ = _prepare(
        "chunk_gla_fwd_intra_gk", q, k, g=g, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    return _fwd_intra(q, k, g, layout, gate_src, cfg)


@functools.partial(jax.jit, static_argnums=(5,))
def _fwd_intra(q, k, g, layout, gate_src, cfg: KernelConfig):
    A = kernels.fwd_intra(
        layout.pack(q, cfg.K), layout.pack(k, cfg.K), gate_slots(g, layout, gate_src, cfg.K), cfg.NT, cfg.C, cfg.scale
    )
    return layout.unpack(A)


# ---------------------------------------------------------------------------------------------
# fwd_o


def chunk_gla_fwd_o_gk(q, v, g, A, h, scale, state_v_first=False, cu_seqlens=None, chunk_size=64, **unused):
    """q, g [B, T, H, K], v [B, T, H, V], A [B, T, H, C] (entries s <= t read), h [B, NT, H, K, V]
    (the state before each chunk) -> o [B, T, H, V] in v's dtype. Kernel: kernels.fwd_o."""
    _no("chunk_gla_fwd_o_gk", state_v_first=state_v_first)
    layout, cfg, gate_src, keep = _prepare(
        "chunk_gla_fwd_o_gk", q, v, g=g, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    return _fwd_o(q, v, g, A, h, layout, gate_src, keep, cfg)


@functools.partial(jax.jit, static_argnums=(8,))
def _fwd_o(q, v, g, A, h, layout, gate_src, keep, cfg: KernelConfig):
    o = kernels.fwd_o(
        layout.pack(q, cfg.K),
        layout.pack(v, cfg.V),
        gate_slots(g, layout, gate_src, cfg.K),
        layout.pack(A.astype(F32)),
        states_in(h, layout, keep, cfg),
        cfg.NT,
        cfg.C,
        cfg.scale,
        v.dtype,
    )
    return layout.unpack(o, cfg.V_in)


# ---------------------------------------------------------------------------------------------
# bwd_dh


def chunk_bwd_dh(
    q,
    k,
    v,
    do,
    h0,
    dht,
    scale,
    g=None,
    g_gamma=None,
    gk=None,
    gv=None,
    state_v_first=False,
    cu_seqlens=None,
    chunk_size=64,
    states_in_fp32=False,
    **unused,
):
    """q, k, gk [B, T, H, K], v, do [B, T, H, V], h0 [N, H, K, V] or None (only whether dh0 is
    wanted), dht [N, H, K, V] or None (zeros) -> (dh [B, NT, H, K, V]: the gradient w.r.t. the
    state after each chunk, float32 with states_in_fp32 (else k's dtype), dh0 [N, H, K, V]
    float32 or None without h0). Kernel: kernels.bwd_dh."""
    _no("chunk_bwd_dh", g=g, g_gamma=g_gamma, gv=gv, state_v_first=state_v_first)
    layout, cfg, gate_src, keep = _prepare(
        "chunk_bwd_dh", q, do, g=gk, scale=scale, h0=h0, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    dh_dtype = jnp.dtype(F32 if states_in_fp32 else k.dtype)
    dh, dh0 = _bwd_dh(q, do, gk, dht, layout, gate_src, keep, cfg, dh_dtype)
    return dh, (dh0 if h0 is not None else None)


@functools.partial(jax.jit, static_argnums=(7, 8))
def _bwd_dh(q, do, gk, dht, layout, gate_src, keep, cfg: KernelConfig, dh_dtype):
    dhtp = jnp.zeros((cfg.N, cfg.H, cfg.K, cfg.V), F32) if dht is None else cfg.pad_state(dht)
    dh, dh0 = kernels.bwd_dh(
        layout.pack(q, cfg.K),
        layout.pack(do, cfg.V),
        gate_slots(gk, layout, gate_src, cfg.K),
        dhtp,
        layout.tables(),
        cfg.NT,
        cfg.C,
        cfg.scale,
    )
    return states_out(dh, layout, keep, cfg).astype(dh_dtype), cfg.cut_state(dh0)


# ---------------------------------------------------------------------------------------------
# bwd_dv


def chunk_gla_bwd_dv(k, g, A, do, dh, state_v_first=False, cu_seqlens=None, chunk_size=64, **unused):
    """k, g [B, T, H, K], A [B, T, H, C] (the forward's; entries s <= t read), do [B, T, H, V],
    dh [B, NT, H, K, V] -> dv [B, T, H, V] in do's dtype. Kernel: kernels.bwd_dv."""
    _no("chunk_gla_bwd_dv", state_v_first=state_v_first)
    layout, cfg, gate_src, keep = _prepare("chunk_gla_bwd_dv", k, do, g=g, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    return _bwd_dv(k, g, A, do, dh, layout, gate_src, keep, cfg)


@functools.partial(jax.jit, static_argnums=(8,))
def _bwd_dv(k, g, A, do, dh, layout, gate_src, keep, cfg: KernelConfig):
    dv = kernels.bwd_dv(
        layout.pack(k, cfg.K),
        gate_slots(g, layout, gate_src, cfg.K),
        layout.pack(A.astype(F32)),
        layout.pack(do, cfg.V),
        states_in(dh, layout, keep, cfg),
        cfg.NT,
        cfg.C,
        do.dtype,
    )
    return layout.unpack(dv, cfg.V_in)


# ---------------------------------------------------------------------------------------------
# bwd_dA


def chunk_gla_bwd_dA(v, do, scale, cu_seqlens=None, chunk_size=64, **unused):
    """v, do [B, T, H, V] -> dA [B, T, H, C] float32: scale do_t . v_s for s <= t, 0 above.
    Kernel: kernels.bwd_da."""
    # planned with a one-channel stand-in for q, k: the stage reads only v and do (V up to 512)
    layout, cfg, _, _ = _prepare(
        "chunk_gla_bwd_dA", v[..., :1], do, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    return _bwd_da(v, do, layout, cfg)


@functools.partial(jax.jit, static_argnums=(3,))
def _bwd_da(v, do, layout, cfg: KernelConfig):
    dA = kernels.bwd_da(layout.pack(v, cfg.V), layout.pack(do, cfg.V), cfg.NT, cfg.C, cfg.scale)
    return layout.unpack(dA)


# ---------------------------------------------------------------------------------------------
# bwd_dqk_intra


def chunk_gla_bwd_dqk_intra(q, k, g, dA, cu_seqlens=None, chunk_size=64, **unused):
    """q, k, g [B, T, H, K], dA [B, T, H, C] (entries s <= t read) -> (dq, dk [B, T, H, K]
    float32): the gradients of q, k through A. Kernel: kernels.bwd_dqk_intra."""
    layout, cfg, gate_src, _ = _prepare(
        "chunk_gla_bwd_dqk_intra", q, k, g=g, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    return _bwd_dqk_intra(q, k, g, dA, layout, gate_src, cfg)


@functools.partial(jax.jit, static_argnums=(6,))
def _bwd_dqk_intra(q, k, g, dA, layout, gate_src, cfg: KernelConfig):
    dq, dk = kernels.bwd_dqk_intra(
        layout.pack(q, cfg.K),
        layout.pack(k, cfg.K),
        gate_slots(g, layout, gate_src, cfg.K),
        layout.pack(dA.astype(F32)),
        cfg.NT,
        cfg.C,
    )
    return layout.unpack(dq, cfg.K_in), layout.unpack(dk, cfg.K_in)


# ---------------------------------------------------------------------------------------------
# bwd_dqkg


def chunk_gla_bwd_dqkg(
    q, k, v, h, g, do, dh, dq, dk, scale=None, state_v_first=False, cu_seqlens=None, chunk_size=64, **unused
):
    """q, k, g [B, T, H, K], v, do [B, T, H, V], h, dh [B, NT, H, K, V] (the state before and the
    gradient of the state after each chunk), dq, dk [B, T, H, K] (the intra parts) ->
    (dq, dk [B, T, H, K] in dq's and dk's dtype: the whole gradients, dg [B, T, H, K] in g's
    dtype: the gradient of the op's raw g, its reverse chunk-local cumsum taken). Kernel:
    kernels.bwd_dqkg."""
    _no("chunk_gla_bwd_dqkg", state_v_first=state_v_first)
    layout, cfg, gate_src, keep = _prepare(
        "chunk_gla_bwd_dqkg", q, v, g=g, scale=scale, cu_seqlens=cu_seqlens, chunk_size=chunk_size
    )
    return _bwd_dqkg(q, k, v, h, g, do, dh, dq, dk, layout, gate_src, keep, cfg)


@functools.partial(jax.jit, static_argnums=(12,))
def _bwd_dqkg(q, k, v, h, g, do, dh, dq, dk, layout, gate_src, keep, cfg: KernelConfig):
    dq2, dk2, dg = kernels.bwd_dqkg(
        layout.pack(q, cfg.K),
        layout.pack(k, cfg.K),
        layout.pack(v, cfg.V),
        states_in(h, layout, keep, cfg),
        gate_slots(g, layout, gate_src, cfg.K),
        layout.pack(do, cfg.V),
        states_in(dh, layout, keep, cfg),
        layout.pack(dq.astype(F32), cfg.K),
        layout.pack(dk.astype(F32), cfg.K),
        cfg.NT,
        cfg.C,
        cfg.scale,
    )
    # dg of a padding slot repeats its chunk's gradient total: only the real tokens are unpacked
    return (
        layout.unpack(dq2, cfg.K_in).astype(dq.dtype),
        layout.unpack(dk2, cfg.K_in).astype(dk.dtype),
        layout.unpack(dg, cfg.K_in).astype(g.dtype),
    )
