"""The fast float64 formulation of the oracle: chunked, in numpy, with a hand-written backward.

Same maths as the per-token recurrence (references/common.py `run_recurrence` with each op's
`step`, the definition), regrouped by chunks of C tokens; every sum is a sum of the same
terms, so it agrees with the recurrence to rounding (held to 1e-12 by tests/test_oracle.py).

Per sequence, head and chunk (tokens i = 0..L, S the state before the chunk, b_i = g_0 + ... +
g_i the chunk-local cumulative log-decay, per channel [K] or one per head):
    S_i   = exp(b_i) S + sum_{j<=i} E_ij k_j^T u_j           (u = v; kda: see kda_chunked)
    o_i   = scale q_i S_i = (scale q_i exp(b_i)) S + sum_{j<=i} A_ij u_j,
            A_ij = scale sum_k q_ik k_jk E_ijk                       (j <= i)
    S_end = exp(b_L) S + sum_j (k_j exp(b_L - b_j))^T u_j
with E_ij = exp(g_{j+1}) * ... * exp(g_i) the decay from token j to token i (j <= i; 1 for
i = j), formed as the recurrence forms it, one factor per token, and never above the diagonal.
Every decay here is one the recurrence applies too (from a token to a token, or between a
token and a chunk boundary); none is split as exp(b_i) exp(-b_j) through a point outside
[j, i], which can overflow. So nothing overflows where the recurrence does not, underflow
only touches terms below 1e-300 of what they are added to, and no regime (the stress gates
included) needs a fallback to the recurrence.
A per-head gate needs [C, C] decays, a per-channel one [C, C, K] (in slices of chunks).

The gate gradient is computed without cancellation, like the recurrence's: g_s multiplies
exactly the contributions of a source before s (a token j < s, or the state before the chunk,
h0 included) to a reader at or after s (a token i >= s, or the state after the chunk, dht
included), so dg_s is the sum of those pairs' terms; never sum_i (q_i dq_i - k_i dk_i), whose
big terms cancel when exp(g_s) is small.

Layout: tokens [B, T] are cut per sequence (B rows, or cu_seqlens for packed varlen) into
chunks of C, the last one of each sequence zero-padded (padding has g = 0, q = k = v = 0,
beta (b, w) = 0 and do = 0: it changes nothing); in chunk layout an array is [H, NC, C, F] (a group
of heads, NC chunks) and a state [H, NC, K, V]. Groups of heads run in parallel threads, with
numpy's BLAS kept to one thread (its hand-off on many small products is slow, very slow on
shared cores).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

CHUNK_HEAD_GATE = 64  # simple_gla, gdn: [C, C] decays, matmuls
CHUNK_CHANNEL_GATE = 16  # gla, kda: [C, C, K] decays
SLICE_ELEMENTS = 2**17  # the elements of one [H, n, C, C, K] temporary (in cache)
GROUP_ELEMENTS = 2**21  # heads are grouped to about this many elements per state array


class Chunks:
    """The chunk layout of tokens [B, T] (B sequences, or packed by cu_seqlens when B == 1).

    idx [NC, C]: flat token index (b * T + t) of each chunk position (0 at padding, where
    valid [NC, C] is False); seq [NC]: its sequence; first / last [NC]: whether it is its
    sequence's first / last chunk."""

    def __init__(self, B: int, T: int, cu_seqlens, C: int):
        if cu_seqlens is None:
            starts, ends = np.arange(B) * T, np.arange(1, B + 1) * T
        else:
            cu = np.asarray(cu_seqlens, np.int64)
            starts, ends = cu[:-1], cu[1:]
        begin = [np.arange(s, e, C) for s, e in zip(starts, ends)]
        self.seq = np.concatenate([np.full(len(c), n) for n, c in enumerate(begin)])
        begin = np.concatenate(begin)
        idx = begin[:, None] + np.arange(C)
        self.valid = idx < ends[self.seq][:, None]  # [NC, C] False at padding
        self.idx = np.where(self.valid, idx, 0)
        self.dense = self.idx.size == B * T  # no padding: idx is 0 .. B*T - 1 in order
        self.first = begin == starts[self.seq]
        self.last = begin + C >= ends[self.seq]
        self.N, self.NC, self.C = len(starts), len(begin), C

    def gather(self, x: np.ndarray, hs: slice) -> np.ndarray:
        """Heads hs of token rows x [B*T, H, F] -> float64 chunk layout [h, NC, C, F]."""
        x = x[:, hs]
        if self.dense:
            y = x.reshape((self.NC, self.C) + x.shape[1:])
        else:
            y = np.where(self.valid[:, :, None, None], x[self.idx], 0)
        return np.ascontiguousarray(np.moveaxis(y, 2, 0), dtype=np.float64)

    def scatter(self, out: np.ndarray, hs: slice, y: np.ndarray) -> None:
        """Heads hs of token rows out [B*T, H, F] <- chunk layout y [h, NC, C, F]."""
        y = np.moveaxis(y, 0, 2)
        if self.dense:
            out[:, hs] = y.reshape((-1,) + y.shape[2:])
        else:
            out[self.idx[self.valid], hs] = y[self.valid]

    def states(self, h0: np.ndarray, advance: Callable[[int, np.ndarray], np.ndarray]):
        """The recurrence over chunks, h0 [N, H, K, V]: S_prev [H, NC, K, V] (the state before
        each chunk: h0 of its sequence at a first chunk, else the previous chunk's end state)
        and the final state of each sequence [N, H, K, V]; advance(c, S_prev[:, c]) is chunk
        c's end state."""
        S_prev = np.empty((h0.shape[1], self.NC) + h0.shape[2:])
        ht = np.empty_like(h0)
        S = None
        for c, n in enumerate(self.seq):
            S = h0[n] if self.first[c] else S
            S_prev[:, c] = S
            S = advance(c, S)
            if self.last[c]:
                ht[n] = S
        return S_prev, ht

    def adjoints(self, dht: np.ndarray, retreat: Callable[[int, np.ndarray], np.ndarray]):
        """The same backwards in time: dS_end [H, NC, K, V] (the gradient of each chunk's end
        state: dht of its sequence at a last chunk, else the next chunk's start-state
        gradient) and dh0 [N, H, K, V]; retreat(c, dS_end[:, c]) is the gradient of chunk c's
        start state."""
        dS_end = np.empty((dht.shape[1], self.NC) + dht.shape[2:])
        dh0 = np.empty_like(dht)
        dS = None
        for c in reversed(range(self.NC)):
            n = self.seq[c]
            dS = dht[n] if self.last[c] else dS
            dS_end[:, c] = dS
            dS = retreat(c, dS)
            if self.first[c]:
                dh0[n] = dS
        return dS_end, dh0


# ---------------------------------------------------------------- threads


def _openblas_threads():
    """(get, set) of the thread count of numpy's bundled OpenBLAS, or None (another BLAS)."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    names = [("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_")]
    names.append(("openblas_get_num_threads", "openblas_set_num_threads"))
    for path in glob.glob(os.path.join(libs, "*openblas*")):
        lib = ctypes.CDLL(path)
        for get, set_ in names:
            if hasattr(lib, get) and hasattr(lib, set_):
                return getattr(lib, get), getattr(lib, set_)
    return None


_BLAS = _openblas_threads()
_BLAS_LOCK = threading.Lock()


@contextlib.contextmanager
def _one_blas_thread():
    """numpy's OpenBLAS on one thread for the duration (the thread count is process-wide:
    restored after, and oracle calls that change it take turns)."""
    if _BLAS is None:
        yield
        return
    with _BLAS_LOCK:
        before = _BLAS[0]()
        _BLAS[1](1)
        try:
            yield
        finally:
            _BLAS[1](before)


def _workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ---------------------------------------------------------------- pairs within a chunk
# P_ij = sum_k x_ik y_jk E_ijk for j <= i, else 0, per head and chunk (E: the decays, see
# the module's docstring): x, y [H, NC, C, K]; a = exp(g) [H, NC, C, 1] (one gate per head)
# or [H, NC, C, K] (per channel).


@functools.cache
def _rectangles(C: int) -> np.ndarray:
    """[C(s), C(i) * C(j)]: 1 where i >= s > j (the pairs whose decay g_s is part of), else 0."""
    s, i, j = np.ogrid[:C, :C, :C]
    return ((i >= s) & (j < s)).reshape(C, C * C).astype(np.float64)


def _decays(a: np.ndarray) -> np.ndarray:
    """The decay from token j to token i, a_{j+1} * ... * a_i (1 for i = j), for j <= i, else
    0 (a = exp(g) [H, n, C, G]): [H, n, C, C] for a per-head gate, [H, n, C, C, K] per channel.
    Built one diagonal i - j = d at a time, as the recurrence applies it: one factor per token."""
    H, n, C, G = a.shape
    E = np.zeros((H, n, C, C, G))
    diag = E.reshape(H, n, C * C, G)  # diagonal d: flat index i * C + i - d, i = d .. C - 1
    diag[:, :, 0 :: C + 1] = 1.0
    for d in range(1, C):
        np.multiply(diag[:, :, (d - 1) * C :: C + 1][:, :, 1:], a[:, :, 1 : C - d + 1], out=diag[:, :, d * C :: C + 1])
    return E[..., 0] if G == 1 else E


def _slices(y: np.ndarray):
    """Slices of the chunk axis (1) with [H, n, C, C, K] temporaries of about SLICE_ELEMENTS."""
    H, NC, C, K = y.shape
    step = max(1, SLICE_ELEMENTS // (H * C * C * K))
    return [slice(s, s + step) for s in range(0, NC, step)]


def pairs(xs: list, y: np.ndarray, a: np.ndarray) -> list:
    """[P(x, y) for x in xs], each [H, NC, C, C] (see above)."""
    if a.shape[-1] == 1:
        E = _decays(a)
        return [(x @ _T(y)) * E for x in xs]
    Ps = [np.empty(x.shape[:-1] + x.shape[-2:-1]) for x in xs]
    for s in _slices(y):
        Ey = _decays(a[:, s]) * y[:, s, None, :, :]  # [H, n, C(i), C(j), K]
        for P, x in zip(Ps, xs):
            P[:, s] = (Ey @ x[:, s, :, :, None])[..., 0]
    return Ps


def pair_grads(xs: list, dPs: list, y: np.ndarray, a: np.ndarray, Ps: list | None = None):
    """Gradients of sum_m <dP_m, P_m> for P_m = P(x_m, y) (dP_m lower-triangular; the P_m may
    be given, for a per-head gate): ([dx_m], dy, R) with R [H, NC, C, G] the gate's share,
    R_s = sum over pairs i >= s > j of dP_ij x_ik y_jk E_ijk (summed over k for a per-head
    gate): the pairs whose decay g_s is part of."""
    C = a.shape[2]
    if a.shape[-1] == 1:
        E = _decays(a)
        Ps = Ps or [(x @ _T(y)) * E for x in xs]
        Ws = [dP * E for dP in dPs]
        M = sum(dP * P for dP, P in zip(dPs, Ps))
        R = M.reshape(M.shape[:2] + (C * C,)) @ _rectangles(C).T
        return [W @ y for W in Ws], sum(_T(W) @ x for W, x in zip(Ws, xs)), R[..., None]
    dxs, dy, R = [np.empty_like(x) for x in xs], np.zeros_like(y), np.empty(a.shape)
    for s in _slices(y):
        E = _decays(a[:, s])  # [H, n, C(i), C(j), K]
        Ey = E * y[:, s, None, :, :]
        M = 0
        for dx, x, dP in zip(dxs, xs, dPs):
            x, dP = x[:, s], dP[:, s]
            Ex = E * x[:, :, :, None, :]
            dx[:, s] = (dP[:, :, :, None, :] @ Ey)[:, :, :, 0]  # sum over j
            dy[:, s] += (_T(dP)[:, :, :, None, :] @ Ex.swapaxes(2, 3))[:, :, :, 0]  # sum over i
            M = M + dP[..., None] * Ey * x[:, :, :, None, :]
        R[:, s] = _rectangles(C) @ M.reshape(M.shape[:2] + (C * C, -1))
    return dxs, dy, R


def _suffix(m: np.ndarray) -> np.ndarray:
    """sum over i >= s of m_i along the chunk-position axis (2)."""
    return np.flip(np.cumsum(np.flip(m, 2), 2), 2)


def _prefix_before(n: np.ndarray) -> np.ndarray:
    """sum over j < s of n_j along the chunk-position axis (2)."""
    c = np.cumsum(n, 2)
    return np.concatenate([np.zeros_like(c[:, :, :1]), c[:, :, :-1]], 2)


def _gate_terms(a: np.ndarray, b: np.ndarray, G: int) -> np.ndarray:
    """The per-channel terms a * b [.., K] -> the gate's [.., G] (summed over k for a per-head
    gate)."""
    return np.einsum("...k,...k->...", a, b)[..., None] if G == 1 else a * b


def _state_terms(S: np.ndarray, dS: np.ndarray, G: int) -> np.ndarray:
    """sum over v of S * dS [H, NC, K, V] -> [H, NC, G] (also over k for a per-head gate)."""
    return np.einsum("hnkv,hnkv->hn", S, dS)[..., None] if G == 1 else np.einsum("hnkv,hnkv->hnk", S, dS)


def _T(x):
    return x.swapaxes(-1, -2)


# ---------------------------------------------------------------- driver


def _run(core, chunk: int, tok: dict, scale: float, h0, cu_seqlens, do, dht):
    """Run `core` in chunk layout over groups of heads, in threads.

    tok: per-token inputs [B, T, H, F] by name (q, k, v, g, ...); h0, dht [N, H, K, V] or None;
    do [B, T, H, V] or None (forward only). core(ch, x, scale, h0, dO, dht) takes one group of
    heads (x and dO in chunk layout) and returns (o, ht, grads or None), grads keyed like tok
    plus 'initial_state'. Returns (o, ht) or (o, ht, grads) in the token layout, float64."""
    B, T, H, K = np.shape(tok["q"])
    V = np.shape(tok["v"])[-1]
    ch = Chunks(B, T, cu_seqlens, chunk)
    rows = lambda a: np.asarray(a).reshape((B * T,) + np.shape(a)[2:])  # noqa: E731
    x = {n: rows(a) for n, a in tok.items()}
    dO = None if do is None else rows(do)
    h0 = np.zeros((ch.N, H, K, V)) if h0 is None else np.asarray(h0, np.float64)
    dht = np.zeros(h0.shape) if dht is None else np.asarray(dht, np.float64)
    o, ht = np.empty((B * T, H, V)), np.empty_like(h0)
    grads = {} if do is None else {n: np.empty(a.shape) for n, a in x.items()} | {"initial_state": np.empty_like(h0)}

    def group(hs: slice):
        xg = {n: ch.gather(a, hs) for n, a in x.items()}
        o_c, ht[:, hs], gr = core(ch, xg, scale, h0[:, hs], None if dO is None else ch.gather(dO, hs), dht[:, hs])
        ch.scatter(o, hs, o_c)
        for n, a in (gr or {}).items():
            if n == "initial_state":
                grads[n][:, hs] = a
            else:
                ch.scatter(grads[n], hs, a)

    per_head = ch.NC * max(ch.C * max(K, V), K * V)
    step = max(1, min(GROUP_ELEMENTS // per_head, -(-H // _workers())))
    groups = [slice(h, h + step) for h in range(0, H, step)]
    with _one_blas_thread():
        if len(groups) == 1 or _workers() == 1:
            for hs in groups:
                group(hs)
        else:
            with ThreadPoolExecutor(min(len(groups), _workers())) as pool:
                list(pool.map(group, groups))
    tokens = lambda a: a.reshape((B, T) + a.shape[1:])  # noqa: E731
    if do is None:
        return tokens(o), ht
    return tokens(o), ht, {n: a if n == "initial_state" else tokens(a) for n, a in grads.items()}


# ---------------------------------------------------------------- simple_gla, gla


def gla_chunked(q, k, v, g, scale, h0, cu_seqlens, *, do=None, dht=None, chunk=None):
    """Forward (and, given do, the backward) of S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t,
    o_t = scale q_t S_t, per sequence from h0 (None: 0).

    q, k [B, T, H, K]; v, do [B, T, H, V]; g [B, T, H, 1] (one log-decay per head:
    simple_gla) or [B, T, H, K] (per channel: gla); h0, dht [N, H, K, V] or None.
    Returns (o, ht) or (o, ht, grads) with grads q, k, v, g (each its input's shape) and
    initial_state: the gradients of <do, o> + <dht, ht>."""
    C = chunk or (CHUNK_HEAD_GATE if np.shape(g)[-1] == 1 else CHUNK_CHANNEL_GATE)
    return _run(_gla, C, {"q": q, "k": k, "v": v, "g": g}, scale, h0, cu_seqlens, do, dht)


def _gla(ch: Chunks, x: dict, scale: float, h0, dO, dht):
    """gla_chunked on one group of heads, in chunk layout."""
    qs, kc, vc = x["q"] * scale, x["k"], x["v"]
    b = np.cumsum(x["g"], axis=2)  # [H, NC, C, G] from the chunk start, inclusive
    bL = b[:, :, -1:]  # [H, NC, 1, G] the whole chunk
    G = b.shape[-1]
    qd = qs * np.exp(b)  # reads the state before the chunk
    kd = kc * np.exp(bL - b)  # writes the state after it
    decay = np.exp(_T(bL))  # [H, NC, G, 1]: S_end = decay * S_prev + kd^T v
    (A,) = pairs([qs], kc, np.exp(x["g"]))
    S_prev, ht = ch.states(h0, lambda c, S: decay[:, c] * S + _T(kd[:, c]) @ vc[:, c])
    o = qd @ S_prev + A @ vc
    if dO is None:
        return o, ht, None
    dS_end, dh0 = ch.adjoints(dht, lambda c, dS: decay[:, c] * dS + _T(qd[:, c]) @ dO[:, c])
    dq_in = dO @ _T(S_prev)  # gradient of qd
    dk_out = vc @ _T(dS_end)  # gradient of kd
    (dqs,), dk, R = pair_grads([qs], [np.tril(dO @ _T(vc))], kc, np.exp(x["g"]), [A])
    dqs += dq_in * np.exp(b)
    dk += dk_out * np.exp(bL - b)
    dv = _T(A) @ dO + kd @ dS_end
    # dg_s, the pairs (source before s, reader at or after s): token j -> token i in the chunk
    # (R); state before -> token i >= s; token j < s -> state after; state before -> after
    dg = R + _suffix(_gate_terms(qd, dq_in, G)) + _prefix_before(_gate_terms(kd, dk_out, G))
    dg += (decay[..., 0] * _state_terms(S_prev, dS_end, G))[:, :, None]
    return o, ht, {"q": dqs * scale, "k": dk, "v": dv, "g": dg, "initial_state": dh0}


# ---------------------------------------------------------------- kda


def _unit_lower_inverse(Lb: np.ndarray) -> np.ndarray:
    """(I + Lb)^-1 for Lb [.., C, C] strictly lower, by forward substitution (row i of the
    inverse from rows j < i, in time order)."""
    C = Lb.shape[-1]
    X = np.zeros(Lb.shape)
    for i in range(C):
        X[..., i, :i] = -(Lb[..., i : i + 1, :i] @ X[..., :i, :i])[..., 0, :]
        X[..., i, i] = 1.0
    return X


def gdn2_chunked(q, k, v, g, b, w, scale, h0, cu_seqlens, *, do=None, dht=None, chunk=None):
    """Forward (and, given do, the backward) of GDN-2, the gated delta rule with channel-wise gates
    S'_t = diag(exp(g_t)) S_{t-1},  S_t = S'_t + k_t^T (w_t * v_t - (b_t * k_t) S'_t),  o_t = scale q_t S_t
    (b_t [K] the erase gate, w_t [V] the write gate; b = w = beta is kda: `kda_chunked`).

    Written S_t = S'_t + k_t^T u_t with u_t = w_t * v_t - (b_t * k_t) S'_t [V], a chunk is the gla
    chunk with v replaced by u, and u solves, per chunk, the unit lower-triangular system
        u_i + sum_{j<i} L_ij u_j = w_i * v_i - (b_i * k_i * exp(b_i)) S,
        L_ij = sum_k b_ik k_ik k_jk E_ijk                           (j < i)
    (the prediction (b_i * k_i) S'_i unrolled over the chunk; b_i here the erase gate, exp(b_i)
    the decay from the chunk start); (I + L)^-1 comes by forward substitution, token by token.
    The backward is the implicit-function vjp of that system: lam = (I + L)^-T du, dv = w * lam,
    dw = v * lam, d(L, b * k * exp(b), S) = -lam (u, S, b * k * exp(b))^T, and db, dk from
    d(b * k) by the product rule.

    q, k [B, T, H, K]; g [B, T, HV, K] per channel (kda, gdn2) or [B, T, HV, 1] per head (gdn); b
    [B, T, HV, K]; v, w, do [B, T, HV, V]; h0, dht [N, HV, K, V] or None. HV = G * H: value head j
    reads q, k head j // G (computed as HV heads on q, k repeated G times; dq, dk summed over the
    group). Returns (o, ht) or (o, ht, grads) with grads q, k, v, g, b, w, initial_state."""
    G = np.shape(v)[2] // np.shape(q)[2]
    rep = lambda a: np.repeat(np.asarray(a), G, axis=2)  # noqa: E731
    tok = {"q": rep(q), "k": rep(k), "v": v, "g": g, "b": b, "w": w}
    C = chunk or (CHUNK_HEAD_GATE if np.shape(g)[-1] == 1 else CHUNK_CHANNEL_GATE)
    out = _run(_gdn2, C, tok, scale, h0, cu_seqlens, do, dht)
    if do is not None:
        grads = out[2]
        for n in ("q", "k"):
            B, T, HV, K = grads[n].shape
            grads[n] = grads[n].reshape(B, T, HV // G, G, K).sum(3)
    return out


def kda_chunked(q, k, v, g, beta, scale, h0, cu_seqlens, *, do=None, dht=None, chunk=None):
    """Forward (and, given do, the backward) of the gated delta rule
    S'_t = diag(exp(g_t)) S_{t-1},  S_t = S'_t + beta_t k_t^T (v_t - k_t S'_t),  o_t = scale q_t S_t:
    `gdn2_chunked` with b = beta on every key channel and w = beta on every value channel, so
    dbeta = sum over K of db + sum over V of dw.

    q, k [B, T, H, K]; g [B, T, HV, K] per channel (kda) or [B, T, HV, 1] per head (gdn); v, do
    [B, T, HV, V]; beta [B, T, HV]; h0, dht [N, HV, K, V] or None (grouped value heads as there).
    Returns (o, ht) or (o, ht, grads) with grads q, k, v, g, beta, initial_state."""
    beta = np.asarray(beta, np.float64)[..., None]
    b = np.broadcast_to(beta, beta.shape[:-1] + (np.shape(q)[-1],))
    w = np.broadcast_to(beta, beta.shape[:-1] + (np.shape(v)[-1],))
    out = gdn2_chunked(q, k, v, g, b, w, scale, h0, cu_seqlens, do=do, dht=dht, chunk=chunk)
    if do is not None:
        grads = out[2]
        grads["beta"] = grads.pop("b").sum(-1) + grads.pop("w").sum(-1)
    return out


def _gdn2(ch: Chunks, x: dict, scale: float, h0, dO, dht):
    """gdn2_chunked on one group of heads, in chunk layout."""
    qs, kc, vc, eg, wg = x["q"] * scale, x["k"], x["v"], x["b"], x["w"]  # eg: the erase gate b
    b = np.cumsum(x["g"], axis=2)  # [H, NC, C, K] from the chunk start, inclusive
    bL = b[:, :, -1:]
    G = b.shape[-1]
    eb = np.exp(b)
    bk = eg * kc  # the erase key
    qd, kq, kd = qs * eb, bk * eb, kc * np.exp(bL - b)  # kq: predicts from the state before
    decay = np.exp(_T(bL))  # [H, NC, K, 1]
    A, L = pairs([qs, bk], kc, np.exp(x["g"]))
    L = np.tril(L, -1)
    Minv = _unit_lower_inverse(L)  # (I + L)^-1
    wv = wg * vc
    u, pred = np.empty_like(vc), np.empty_like(vc)  # pred: kq S_prev

    def advance(c, S):
        pred[:, c] = kq[:, c] @ S
        u[:, c] = Minv[:, c] @ (wv[:, c] - pred[:, c])
        return decay[:, c] * S + _T(kd[:, c]) @ u[:, c]

    S_prev, ht = ch.states(h0, advance)
    o = qd @ S_prev + A @ u
    if dO is None:
        return o, ht, None
    du_o = _T(A) @ dO
    lam = np.empty_like(vc)  # (I + L)^-T du, du = A^T dO + kd dS_end

    def retreat(c, dS):
        lam[:, c] = _T(Minv[:, c]) @ (du_o[:, c] + kd[:, c] @ dS)
        return decay[:, c] * dS + _T(qd[:, c]) @ dO[:, c] - _T(kq[:, c]) @ lam[:, c]

    dS_end, dh0 = ch.adjoints(dht, retreat)
    dkq = -lam @ _T(S_prev)
    dq_in = dO @ _T(S_prev)
    dk_out = u @ _T(dS_end)
    dPs = [np.tril(dO @ _T(u)), -np.tril(lam @ _T(u), -1)]
    (dqs, dbk), dk, R = pair_grads([qs, bk], dPs, kc, np.exp(x["g"]))
    dqs += dq_in * eb
    dbk += dkq * eb
    dk += eg * dbk + dk_out * np.exp(bL - b)
    # dg_s: the pairs across s, as in _gla, and the prediction's (L, kq)
    dg = R + _suffix(_gate_terms(qd, dq_in, G) + _gate_terms(kq, dkq, G)) + _prefix_before(_gate_terms(kd, dk_out, G))
    dg += (decay[..., 0] * _state_terms(S_prev, dS_end, G))[:, :, None]
    grads = {"q": dqs * scale, "k": dk, "v": wg * lam, "g": dg, "b": kc * dbk, "w": vc * lam}
    return o, ht, grads | {"initial_state": dh0}
