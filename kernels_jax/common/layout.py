"""The one chunk layout every kernels_jax op runs on, for B rows of T tokens or packed sequences.

Kernels see tokens head-major and chunk-aligned: x [B, T, H, D] -> packed [H, NT * C, D].
Every sequence starts on a fresh chunk and its last chunk is zero-padded (q = k = v = 0,
log-decay 0: padding adds nothing and decays nothing, so a sequence's final state is the state
after its last chunk). B rows of T tokens are B sequences (cu = 0, T, 2T, ...); with cu_seqlens
(B == 1) each packed sequence is one. An empty sequence gets one chunk of padding, so its state
passes through. Per chunk c, int32 [NT] tables (scalar prefetch for the kernels):

    seq[c]     the sequence of chunk c: the row of the state [N, H, K, V] it reads and writes
    first[c]   1 where chunk c starts its sequence (load the initial state / emit dh0)
    last[c]    1 where chunk c ends its sequence (emit the final state / load dht)
    length[c]  real tokens in chunk c (C except in a sequence's last chunk)

`plan` is one function for both cases FLA distinguishes: with cu_seqlens known on the host
(numpy) NT is exact; with traced cu_seqlens (under jit) NT is the static bound T // C + N and
the spare chunks at the end are padding of the last sequence. The same fields either way
(FLA's `prepare_chunk_indices`, prepared once for every op).

Packing is a gather by the `src` table, except for B rows of T tokens (`rows`): there each row
is T tokens zero-padded to whole chunks, and pack / unpack are a pad, a reshape and a transpose
(the same values; no gather for the TPU to run, or for XLA to compile, at realistic shapes).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .validation import is_concrete


def padded_dim(d: int, align: int) -> int:
    """The head dim a kernel tiles for a real head dim d: d rounded up to a multiple of `align`
    up to 128, past 128 to a multiple of 128 (the lane width: V = 320 -> 384). Zero padding is
    exact for these recurrences: padded key channels keep a zero state row, padded value
    channels a zero state column, and both are cut off the results."""
    return -(-d // align) * align if d <= 128 else -(-d // 128) * 128


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class ChunkLayout:
    """Where each of the caller's B * T tokens sits in the packed [H, NT * C, D]; a pytree
    (sizes static, tables as arrays), so it passes through jit like any argument."""

    B: int
    T: int
    C: int
    N: int  # sequences: B, or len(cu_seqlens) - 1
    NT: int  # chunks
    seq: object  # int32 [NT]
    first: object  # int32 [NT]
    last: object  # int32 [NT]
    length: object  # int32 [NT]
    src: object  # int32 [NT * C]: token of each slot, B * T for padding
    dst: object  # int32 [B * T]: slot of each token
    rows: bool = False  # B rows of T tokens (no cu_seqlens): NT / B chunks per row, rows in order

    def tree_flatten(self):
        return (self.seq, self.first, self.last, self.length, self.src, self.dst), (
            self.B,
            self.T,
            self.C,
            self.N,
            self.NT,
            self.rows,
        )

    @classmethod
    def tree_unflatten(cls, sizes, tables):
        *sizes, rows = sizes
        return cls(*sizes, *tables, rows=rows)

    @property
    def slots(self) -> int:
        return self.NT * self.C

    def tables(self) -> list:
        """[seq, first, last] int32 [NT] each: the kernels' scalar prefetch."""
        return [jnp.asarray(t, jnp.int32) for t in (self.seq, self.first, self.last)]

    def steps(self):
        """[NT, C] float32: min(i + 1, length[c]), the decay steps from chunk c's start up to
        slot i (constant over padding slots, so a scalar decay gamma * steps stops there)."""
        i = jnp.arange(1, self.C + 1, dtype=jnp.int32)[None, :]
        return jnp.minimum(i, jnp.asarray(self.length, jnp.int32)[:, None]).astype(jnp.float32)

    def pack(self, x, width: int | None = None):
        """x [B, T, H, *D] -> [H, NT * C, *D] (zero padding slots); width: zero-pad the last
        dim to this size (the kernels' padded head dim)."""
        if width is not None and width != x.shape[-1]:
            x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])
        if self.rows:  # [B, T] -> [B, NT / B * C] by zero padding; rows of whole chunks, in order
            x = jnp.pad(x, [(0, 0), (0, self.slots // self.B - self.T)] + [(0, 0)] * (x.ndim - 2))
            return jnp.moveaxis(x.reshape((self.slots,) + x.shape[2:]), 0, 1)
        flat = x.reshape((self.B * self.T,) + x.shape[2:])
        flat = jnp.concatenate([flat, jnp.zeros_like(flat[:1])], axis=0)
        return jnp.moveaxis(jnp.take(flat, jnp.asarray(self.src, jnp.int32), axis=0), 0, 1)

    def unpack(self, y, width: int | None = None):
        """y [H, NT * C, *D] -> [B, T, H, *D]; width: keep the first `width` of the last dim."""
        y = jnp.moveaxis(y, 0, 1)
        if self.rows:
            y = y.reshape((self.B, self.slots // self.B) + y.shape[1:])[:, : self.T]
        else:
            y = jnp.take(y, jnp.asarray(self.dst, jnp.int32), axis=0)
            y = y.reshape((self.B, self.T) + y.shape[1:])
        return y if width is None else y[..., :width]


def plan(B: int, T: int, C: int, cu_seqlens=None) -> ChunkLayout:
    """The layout of B rows of T tokens, or of packed sequences cu_seqlens [N + 1] (B == 1)."""
    concrete = cu_seqlens is None or is_concrete(cu_seqlens)
    xp = np if concrete else jnp
    if cu_seqlens is None:
        cu = np.arange(B + 1, dtype=np.int32) * T
    else:
        cu = np.asarray(cu_seqlens).astype(np.int32) if concrete else jnp.asarray(cu_seqlens, jnp.int32)
    N = cu.shape[0] - 1
    lens = cu[1:] - cu[:-1]
    nchunks = xp.maximum(1, (lens + C - 1) // C)
    start = xp.concatenate([xp.zeros(1, xp.int32), xp.cumsum(nchunks)[:-1].astype(xp.int32)])
    NT = int(nchunks.sum()) if concrete else B * T // C + N
    c = xp.arange(NT, dtype=xp.int32)
    seq = xp.clip(xp.searchsorted(start, c, side="right") - 1, 0, N - 1).astype(xp.int32)
    first = (c == start[seq]).astype(xp.int32)
    last = (seq != xp.concatenate([seq[1:], xp.full((1,), N, xp.int32)])).astype(xp.int32)
    length = xp.clip(lens[seq] - (c - start[seq]) * C, 0, C).astype(xp.int32)
    slot = xp.arange(NT * C, dtype=xp.int32)
    slot_seq = seq[slot // C]
    offset = slot - start[slot_seq] * C
    src = xp.where(offset < lens[slot_seq], cu[slot_seq] + offset, B * T).astype(xp.int32)
    t = xp.arange(B * T, dtype=xp.int32)
    tok_seq = xp.clip(xp.searchsorted(cu[1:], t, side="right"), 0, N - 1)
    dst = (start[tok_seq] * C + t - cu[tok_seq]).astype(xp.int32)
    return ChunkLayout(B, T, C, N, NT, seq, first, last, length, src, dst, rows=cu_seqlens is None)
