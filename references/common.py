"""The shared machinery of the float64 oracle: validation, the recurrence scan, autodiff.

Every op is a per-token recurrence over a state S [N, H, K, V]:
    S_t = step(S_{t-1}, token inputs at t),   o_t = read(S_t, q_t)
written once per op (references/<op>.py) as a plain function of one time step: the
definition of the op. `run_recurrence` runs it as a `lax.scan` over T in float64, with x64
enabled only inside `float64()` (never process-wide), and gets every gradient by autodiff of
that scan (method="recurrence"). The oracle's default, method="chunked", computes the same
maths in chunks in numpy (references/chunked.py), held to this one at 1e-12 by the tests.

Packed varlen (`cu_seqlens`, B == 1): at each sequence start the state is replaced by
that sequence's initial state (zeros if none); the final state of sequence n is the
state after its last token. Nothing else crosses a boundary.

Memory: the scan is split into blocks of `BLOCK` steps under `jax.checkpoint`, so the
backward stores one state per block and recomputes inside a block.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

BLOCK = 64
METHODS = ("chunked", "recurrence")  # how the ops compute; the first is the default


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    return method


@contextlib.contextmanager
def float64():
    """Enable jax x64, on the CPU, for the duration of an oracle call only."""
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        yield


def _shape(name, x, rank):
    x = np.asarray(x)
    if x.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {x.shape}")
    return x.shape


def validate(
    q,
    k,
    v,
    *,
    gates: dict[str, tuple[np.ndarray | None, tuple]],
    initial_state=None,
    cu_seqlens=None,
    grouped: bool = False,
) -> tuple[int, int, int, int, int, int]:
    """Check shapes against FLA's layout; returns (B, T, HV, K, V, N), HV the heads of v and
    of the state: H, or with grouped (the delta-rule ops) any multiple G * H of the q, k heads.

    gates maps an argument name to (array or None, expected shape with B/T/H/K symbols
    already substituted) for the gate-like inputs (g, g_gamma, beta)."""
    B, T, H, K = _shape("q", q, 4)
    if np.shape(k) != (B, T, H, K):
        raise ValueError(f"k must have the shape of q {(B, T, H, K)} [B, T, H, K], got {np.shape(k)}")
    vs = _shape("v", v, 4)
    if grouped and (vs[:2] != (B, T) or vs[2] % H):
        raise ValueError(f"v must have shape [B, T, HV, V] = [{B}, {T}, HV, V], HV a multiple of H = {H}, got {vs}")
    if not grouped and vs[:3] != (B, T, H):
        raise ValueError(f"v must have shape [B, T, H, V] = [{B}, {T}, {H}, V], got {vs}")
    heads = "HV" if grouped else "H"
    H, V = vs[2], vs[3]
    for name, (x, expected) in gates.items():
        if x is not None and np.shape(x) != tuple(expected):
            raise ValueError(f"{name} must have shape {tuple(expected)}, got {np.shape(x)}")
    N = B
    if cu_seqlens is not None:
        cu = np.asarray(cu_seqlens)
        if B != 1:
            raise ValueError(f"cu_seqlens requires B == 1 (packed sequences), got B={B}")
        if cu.ndim != 1 or cu.size < 2:
            raise ValueError(f"cu_seqlens must be a 1-D array [N + 1] with N >= 1, got shape {cu.shape}")
        if cu[0] != 0:
            raise ValueError(f"cu_seqlens must start at 0, got {cu[0]}")
        if np.any(np.diff(cu) <= 0):
            raise ValueError(f"cu_seqlens must be strictly increasing, got {cu.tolist()}")
        if cu[-1] != T:
            raise ValueError(f"cu_seqlens must end at T={T}, got {cu[-1]}")
        N = cu.size - 1
    if initial_state is not None and np.shape(initial_state) != (N, H, K, V):
        raise ValueError(
            f"initial_state must have shape [N, {heads}, K, V] = {(N, H, K, V)}, got {np.shape(initial_state)}"
        )
    return B, T, H, K, V, N


def _segments(T: int, B: int, cu_seqlens) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Per-step sequence index, start flag and end flag (each [T]), and N."""
    if cu_seqlens is None:
        seg = np.zeros(T, np.int32)
        start = np.zeros(T, bool)
        start[0] = True
        end = np.zeros(T, bool)
        end[-1] = True
        return seg, start, end, B
    cu = np.asarray(cu_seqlens)
    seg = np.repeat(np.arange(cu.size - 1, dtype=np.int32), np.diff(cu))
    start = np.zeros(T, bool)
    start[cu[:-1]] = True
    end = np.zeros(T, bool)
    end[cu[1:] - 1] = True
    return seg, start, end, cu.size - 1


StepFn = Callable[..., tuple[jnp.ndarray, jnp.ndarray]]


@functools.partial(jax.jit, static_argnames=("step", "varlen", "N"))
def _scan(step: StepFn, xs: dict, h0, seg, start, end, *, varlen: bool, N: int):
    """Run `step` over time. xs: per-token inputs with time as axis 0 ([T, B, H, ...]);
    h0 [N, H, K, V]. Returns (o [T, B, H, V], ht [N, H, K, V])."""
    T = seg.shape[0]
    nblk = -(-T // BLOCK)
    pad = nblk * BLOCK - T
    # padded steps are never a start or an end and have zero inputs: they do not touch ht
    padT = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape((nblk, BLOCK) + a.shape[1:])
    xs_b = {n: padT(a) for n, a in xs.items()}
    seg_b, start_b, end_b = padT(seg), padT(start), padT(end)
    B = xs["q"].shape[1]
    S0 = jnp.zeros((B,) + h0.shape[1:], h0.dtype)

    def one_step(carry, inp):
        S, ht = carry
        x, n, is_start, is_end = inp
        init = h0[n][None] if varlen else h0
        S = jnp.where(is_start, init, S)
        S, o = step(S, **x)
        if varlen:
            ht = ht.at[n].set(jnp.where(is_end, S[0], ht[n]))
        else:
            ht = jnp.where(is_end, S, ht)
        return (S, ht), o

    @jax.checkpoint
    def one_block(carry, blk):
        return jax.lax.scan(one_step, carry, blk)

    (_, ht), o = jax.lax.scan(one_block, (S0, jnp.zeros_like(h0)), (xs_b, seg_b, start_b, end_b))
    return o.reshape((nblk * BLOCK,) + o.shape[2:])[:T], ht


def run_recurrence(
    step: StepFn,
    token_inputs: dict[str, np.ndarray],
    initial_state,
    cu_seqlens,
    shape_BTHKVN,
    *,
    cotangents: tuple | None = None,
):
    """Forward (and, given cotangents (do, dht), the vjp) of a recurrence in float64.

    token_inputs: per-token arrays [B, T, H, ...], passed to `step` by name (a per-head
    parameter such as g_gamma [H] is given broadcast to [B, T, H]; its gradient is the sum of
    the per-token one).
    Returns (o, ht) or (o, ht, grads); grads keyed like the inputs plus 'initial_state'.
    """
    B, T, H, K, V, N = shape_BTHKVN
    seg, start, end, N = _segments(T, B, cu_seqlens)
    with float64():
        tok = {n: jnp.asarray(np.asarray(a, np.float64)) for n, a in token_inputs.items()}
        h0 = (
            jnp.zeros((N, H, K, V), jnp.float64)
            if initial_state is None
            else jnp.asarray(np.asarray(initial_state, np.float64))
        )

        def fwd(tok, h0):
            xs = {n: jnp.moveaxis(a, 1, 0) for n, a in tok.items()}
            o, ht = _scan(step, xs, h0, seg, start, end, varlen=cu_seqlens is not None, N=N)
            return jnp.moveaxis(o, 0, 1), ht

        if cotangents is None:
            o, ht = fwd(tok, h0)
            return np.asarray(o), np.asarray(ht)
        (o, ht), vjp = jax.vjp(fwd, tok, h0)
        do, dht = cotangents
        do = jnp.asarray(np.asarray(do, np.float64))
        dht = jnp.zeros_like(ht) if dht is None else jnp.asarray(np.asarray(dht, np.float64))
        dtok, dh0 = vjp((do, dht))
        grads = {n: np.asarray(a) for n, a in dtok.items()}
        grads["initial_state"] = np.asarray(dh0)
        return np.asarray(o), np.asarray(ht), grads
