"""The chunk-aligned, head-major layout the chunked kernels run on, for any T and for varlen.

Kernels see rows [R, H, NT * C, D] in which every chunk of C slots belongs to one
sequence: with no cu_seqlens, R = B and each row is one sequence padded at the end to
NT * C; with cu_seqlens (B == 1), R = 1 and each sequence starts on a fresh chunk, its
last chunk padded. Padding slots hold zeros (q = k = v = do = 0 and log-decay 0), so they
add nothing and decay nothing. Per-chunk tables (host ints, passed to kernels as scalar
prefetch) tell a kernel where to reset and where to emit a state:

    seq[c]    sequence of chunk c, added to the row index: state index n = row + seq[c]
    first[c]  1 where chunk c starts its sequence (reset the state / emit dh0)
    last[c]   1 where chunk c ends its sequence (emit the final state / load dht)
    length[c] real tokens in chunk c (C except in a sequence's last chunk)
    pos0[c]   position of chunk c's first token inside its sequence

`to_chunks` and `from_chunks` are plain jnp gathers/pads, differentiated by jax.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
    B: int            # rows in the caller's layout
    T: int            # tokens per row in the caller's layout
    C: int            # chunk size
    NT: int           # chunks per kernel row
    N: int            # sequences (states): B, or len(cu_seqlens) - 1
    seq: tuple[int, ...]
    first: tuple[int, ...]
    last: tuple[int, ...]
    length: tuple[int, ...]
    pos0: tuple[int, ...]
    src: tuple[int, ...] | None = None   # varlen: source token of each slot (T = padding) [NT * C]
    dst: tuple[int, ...] | None = None   # varlen: slot of each token [T]

    @property
    def rows(self) -> int:
        return 1 if self.src is not None else self.B

    @property
    def slots(self) -> int:
        return self.NT * self.C

    def tables(self) -> tuple[np.ndarray, ...]:
        """(seq, first, last, length, pos0) as int32 arrays [NT] for scalar prefetch."""
        return tuple(np.asarray(t, np.int32) for t in (self.seq, self.first, self.last, self.length, self.pos0))

    def positions(self) -> np.ndarray:
        """[NT, C] float32: 1-based position inside its chunk, clamped to the chunk's real length
        (the chunk-local cumulative count of decays; constant over padding slots)."""
        i = np.arange(1, self.C + 1)[None, :]
        return np.minimum(i, np.asarray(self.length)[:, None]).astype(np.float32)


def plan(B: int, T: int, C: int, cu_seqlens: tuple[int, ...] | None) -> ChunkLayout:
    """The layout for B rows of T tokens, or for packed sequences with boundaries cu_seqlens."""
    if cu_seqlens is None:
        NT = -(-T // C)
        length = tuple(min(C, T - c * C) for c in range(NT))
        return ChunkLayout(B, T, C, NT, B, seq=(0,) * NT, first=(1,) + (0,) * (NT - 1),
                           last=(0,) * (NT - 1) + (1,), length=length, pos0=tuple(c * C for c in range(NT)))
    seq, first, last, length, pos0, src = [], [], [], [], [], []
    dst = np.zeros(T, np.int64)
    for n, (start, end) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        L = end - start
        nc = -(-L // C)
        for j in range(nc):
            slot0 = len(src)
            real = min(C, L - j * C)
            seq.append(n)
            first.append(int(j == 0))
            last.append(int(j == nc - 1))
            length.append(real)
            pos0.append(j * C)
            tok = start + j * C + np.arange(real)
            dst[tok] = slot0 + np.arange(real)
            src.extend(tok.tolist() + [T] * (C - real))
    return ChunkLayout(B, T, C, len(seq), len(cu_seqlens) - 1, tuple(seq), tuple(first), tuple(last),
                       tuple(length), tuple(pos0), src=tuple(src), dst=tuple(int(d) for d in dst))


def to_chunks(x, layout: ChunkLayout):
    """[B, T, H, *D] -> [R, H, NT * C, *D] (head-major, chunk-aligned, zero padding)."""
    if layout.src is None:
        pad = [(0, 0), (0, layout.slots - layout.T)] + [(0, 0)] * (x.ndim - 2)
        x = jnp.pad(x, pad)
    else:
        x = jnp.concatenate([x, jnp.zeros_like(x[:, :1])], axis=1)
        x = jnp.take(x, jnp.asarray(layout.src, jnp.int32), axis=1)
    return jnp.swapaxes(x, 1, 2)


def from_chunks(y, layout: ChunkLayout):
    """[R, H, NT * C, *D] -> [B, T, H, *D], dropping padding slots."""
    y = jnp.swapaxes(y, 1, 2)
    if layout.src is None:
        return y[:, :layout.T]
    return jnp.take(y, jnp.asarray(layout.dst, jnp.int32), axis=1)
