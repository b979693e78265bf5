"""Chunk-aligned packed layout shared by the GLA kernels.

The kernels see every sequence laid out head-first and chunk-aligned:
    x [B, T, H, D] (or varlen [1, T, H, D] with cu_seqlens)  ->  packed [H, NT * C, D]
Each sequence n starts at a chunk boundary and owns chunks [start[n], start[n] + nchunks[n]);
positions past a sequence's end are zero (q = k = v = 0, g = 0: no decay, no state update),
so a sequence's final state is the state after its last chunk. Per chunk, int32 [NT]:
    seq    index of the sequence the chunk belongs to (trailing spare chunks: the last one)
    first  1 at a sequence's first chunk (the state is loaded from initial_state there)
    last   1 at a sequence's last chunk (backward: the state gradient is loaded from dht)
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each token of the caller's [B, T, H, D] tensors lives in the packed [H, NT * C, D]."""
    B: int
    T: int
    N: int             # number of sequences (rows of the state)
    chunk: int
    num_chunks: int    # NT
    seq: Any           # int32 [NT]
    first: Any         # int32 [NT]
    last: Any          # int32 [NT]
    src: Any = None    # varlen: int32 [NT * C] token feeding each packed position
    valid: Any = None  # varlen: bool [NT * C] whether that position holds a token
    dst: Any = None    # varlen: int32 [T] packed position of each token

    def pack(self, x):
        """x [B, T, H, D] -> [H, NT * C, D] (zeros at padding positions)."""
        if self.src is None:
            pad = self.num_chunks // self.B * self.chunk - self.T
            x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
            x = jnp.transpose(x, (2, 0, 1, 3))
            return x.reshape(x.shape[0], -1, x.shape[-1])
        x = jnp.where(self.valid[:, None, None], x[0][self.src], jnp.zeros((), x.dtype))
        return jnp.transpose(x, (1, 0, 2))

    def unpack(self, y):
        """y [H, NT * C, D] -> [B, T, H, D]."""
        if self.dst is None:
            y = y.reshape(y.shape[0], self.B, -1, y.shape[-1])[:, :, : self.T]
            return jnp.transpose(y, (1, 2, 0, 3))
        return jnp.transpose(y[:, self.dst], (1, 0, 2))[None]


def dense_layout(B: int, T: int, chunk: int) -> Layout:
    """B sequences of length T, each padded to a whole number of chunks."""
    per_seq = -(-T // chunk)
    c = np.arange(B * per_seq)
    return Layout(B=B, T=T, N=B, chunk=chunk, num_chunks=B * per_seq,
                  seq=jnp.asarray(c // per_seq, jnp.int32),
                  first=jnp.asarray(c % per_seq == 0, jnp.int32),
                  last=jnp.asarray(c % per_seq == per_seq - 1, jnp.int32))


def varlen_layout(cu_seqlens, T: int, chunk: int) -> Layout:
    """Packed sequences (B == 1) with boundaries cu_seqlens int32 [N + 1]; traceable.

    Every sequence (an empty one too) gets max(1, ceil(len / C)) chunks; NT = T // C + N
    is a static bound on their sum, the spare chunks at the end belong to the last sequence.
    """
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    N = cu.shape[0] - 1
    NT = T // chunk + N
    lens = cu[1:] - cu[:-1]
    nchunks = jnp.maximum(1, (lens + chunk - 1) // chunk)
    start = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(nchunks)[:-1].astype(jnp.int32)])
    c = jnp.arange(NT, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(start, c, side="right") - 1, 0, N - 1).astype(jnp.int32)
    first = (c == start[seq]).astype(jnp.int32)
    last = (seq != jnp.concatenate([seq[1:], jnp.full((1,), N, jnp.int32)])).astype(jnp.int32)
    p = jnp.arange(NT * chunk, dtype=jnp.int32)
    n = seq[p // chunk]
    offset = p - start[n] * chunk
    valid = offset < lens[n]
    src = jnp.clip(cu[n] + offset, 0, T - 1)
    t = jnp.arange(T, dtype=jnp.int32)
    tn = jnp.clip(jnp.searchsorted(cu[1:], t, side="right"), 0, N - 1)
    dst = start[tn] * chunk + (t - cu[tn])
    return Layout(B=1, T=T, N=N, chunk=chunk, num_chunks=NT, seq=seq, first=first, last=last,
                  src=src, valid=valid, dst=dst)
