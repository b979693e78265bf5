"""Layout conversions shared by the ops' FLA-convention stage adapters (kernels_jax/<op>/stages.py),
and the chunk-local cumsum the ops and their local_cumsum stages compute (packed_local_cumsum).

FLA's tensors are token-major [B, T, H, ...] and its per-chunk states [B, NT_fla / B, H, K, V]
(NT_fla chunks per row, or over all packed sequences with B == 1; an empty sequence has none);
the kernels' are head-major on the packed chunk slots [H, NT * C, ...] and [H, NT, K, V] (rows
or sequences packed in order; an empty sequence has one chunk of padding). The layout is planned
on the host (kernels_jax/common/layout.py), so cu_seqlens must be concrete.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels_jax.common.config import KernelConfig
from kernels_jax.common.layout import ChunkLayout, plan
from kernels_jax.common.validation import is_concrete

F32 = jnp.float32
RCP_LN2 = float(1.0 / np.log(2.0))  # FLA 0.6.0's gates are chunk-local cumsums in log2 units


def require_concrete(cu_seqlens, op: str, stage: str) -> None:
    """ValueError unless cu_seqlens is None or concrete (known on the host, not a tracer)."""
    if cu_seqlens is not None and not is_concrete(cu_seqlens):
        raise ValueError(
            f"{op} {stage}: cu_seqlens must be concrete (a numpy or jax array known on the host), got a tracer"
        )


def gate_sources(layout: ChunkLayout):
    """(gate_src int32 [NT * C], keep int32 [NT_fla]) of a planned layout: gate_src the packed slot
    each slot's gate is read from (a padding slot reads its chunk's last real slot); keep the
    kernels' chunks FLA counts (all but empty sequences' chunk)."""
    C, length = layout.C, np.asarray(layout.length)
    i = np.arange(C)[None, :]
    last = np.maximum(length - 1, 0)[:, None]
    gate_src = (np.arange(layout.NT)[:, None] * C + np.minimum(i, last)).reshape(-1).astype(np.int32)
    keep = np.nonzero(length > 0)[0].astype(np.int32)
    return jnp.asarray(gate_src), jnp.asarray(keep)


def gate_slots(g, layout: ChunkLayout, gate_src, width: int | None = None):
    """g [B, T, H, D] -> [H, NT * C, D (width: zero-padded to it)] float32 on the packed slots,
    padding slots holding their chunk's last real value. Linear in g."""
    return jnp.take(layout.pack(g.astype(F32), width), gate_src, axis=1)


def states_out(h, layout: ChunkLayout, keep, cfg: KernelConfig):
    """The kernels' h [H, NT, K, V] -> FLA's [B, NT_fla / B, H, K_in, V_in] (h's dtype)."""
    if keep.shape[0] != layout.NT:
        h = jnp.take(h, keep, axis=1)
    h = cfg.cut_state(h)
    H, _, K, V = h.shape
    return jnp.moveaxis(h.reshape(H, layout.B, -1, K, V), 0, 2)


def states_in(h, layout: ChunkLayout, keep, cfg: KernelConfig):
    """FLA's h [B, NT_fla / B, H, K_in, V_in] -> the kernels' [H, NT, K, V] in h's dtype (zero
    padding; zeros for an empty sequence's chunk)."""
    B, NTr, H, K, V = h.shape
    h = jnp.moveaxis(h, 2, 0).reshape(H, B * NTr, K, V)
    h = jnp.pad(h, ((0, 0), (0, 0), (0, cfg.K - K), (0, cfg.V - V)))
    if keep.shape[0] != layout.NT:
        h = jnp.zeros((H, layout.NT, cfg.K, cfg.V), h.dtype).at[:, keep].set(h)
    return h


def seq_states(x, cfg: KernelConfig):
    """h0 / dht [N, HV, K_in, V_in] or None -> [N, HV, K, V] float32 (zero padding; zeros for None)."""
    if x is None:
        return jnp.zeros((cfg.N, cfg.HV, cfg.K, cfg.V), F32)
    return cfg.pad_state(x)


def chunk_local_cumsum(op: str, g, chunk_size: int, scale, reverse, cu_seqlens):
    """g [B, T, H] or [B, T, H, D] -> the same shape, float32: the cumsum of g within each chunk
    (each sequence's chunks start at its first token; reversed: from each chunk's end), times
    scale when given. A compensated scan in plain jnp on the packed layout (an XLA stage, not a
    Pallas kernel): compensated_cumsum."""
    require_concrete(cu_seqlens, op, "chunk_local_cumsum")
    layout = plan(g.shape[0], g.shape[1], chunk_size, cu_seqlens)
    x = g if g.ndim == 4 else g[..., None]
    out = _local_cumsum(x, layout, scale, bool(reverse))
    return out if g.ndim == 4 else out[..., 0]


def compensated_cumsum(x, axis: int, reverse: bool = False):
    """The inclusive cumsum of float32 x along `axis` (from the end when `reverse`), each sum carried
    with the rounding error of the last addition (Kahan): every output within about an ulp of the exact
    prefix sum, whatever the length. A sequential or tree cumsum in float32 loses log2(n) to n ulps
    (FLA's, on the GPU: a warp's Kogge-Stone tree then its warps in order), so a plain cumsum here
    would be less accurate than FLA's."""
    xs = jnp.moveaxis(x, axis, 0)

    def add(carry, xi):
        total, lost = carry
        y = xi - lost
        t = total + y
        return (t, (t - total) - y), t

    zero = jnp.zeros_like(xs[0])
    _, out = jax.lax.scan(add, (zero, zero), xs, reverse=reverse)
    return jnp.moveaxis(out, 0, axis)


def packed_local_cumsum(x, C: int, scale=None, reverse: bool = False):
    """Packed x [H, NT * C, D] float32 -> its cumsum within each chunk of C slots (from each chunk's
    end when reversed; compensated_cumsum), times scale when given. A padding slot (x = 0) repeats
    its chunk's last real sum."""
    H, P, D = x.shape
    out = compensated_cumsum(x.reshape(H, P // C, C, D), 2, reverse).reshape(x.shape)
    return out if scale is None else out * scale


@functools.partial(jax.jit, static_argnums=(2, 3))
def _local_cumsum(g, layout: ChunkLayout, scale, reverse: bool):
    """g [B, T, H, D] -> [B, T, H, D] float32 (chunk_local_cumsum)."""
    return layout.unpack(packed_local_cumsum(layout.pack(g.astype(F32)), layout.C, scale, reverse))
