"""kernels_jax.simple_gla.stages (FLA 0.6.0's stage calling convention) against a float64 numpy
token recurrence written here, in TPU interpret mode; and fwd_h then fwd_o against the whole op.

Each stage gets the inputs FLA's op gives it: gates in log2 units (g the chunk-local cumsum times
1 / ln 2, g_gamma times 1 / ln 2), h and dh from the float64 recurrence rounded to float32. The
recurrence, per sequence and head (a_t the natural-log decay of token t; S [K, V]):
    S_t = exp(a_t) S_{t-1} + k_t^T v_t,   o_t = scale q_t S_t
and backward R (the gradient w.r.t. S_t from the tokens after t and dht):
    G_t = R_t + scale q_t^T do_t,   R_{t-1} = exp(a_t) G_t
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from kernels_jax.common.platform import compile_for_tpu
from kernels_jax.simple_gla import chunk_simple_gla
from kernels_jax.simple_gla import stages as S

RCP_LN2 = 1.0 / math.log(2.0)
B, T, H, K, V, C = 2, 40, 2, 32, 32, 16
SCALE = K**-0.5
TOL = 1e-5  # max |ours - float64| / max |float64| (float32 arithmetic; measured <= 1e-6)

# name -> (gate, varlen cu_seqlens or None, h0/ht, call the stages under jax.jit)
CONFIGS = {
    "rows-g-h0-ht": ("g", None, True, False),
    "rows-gamma": ("g_gamma", None, False, False),
    # an empty sequence and boundaries off the chunk grid; stages traced under jax.jit
    "varlen-g-h0-ht-jit": ("g", (0, 13, 13, 40), True, True),
}
STAGES = ("local_cumsum", "fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqkwg")


@pytest.fixture
def interpret():
    """TPU interpret mode (the Pallas kernels run on this CPU)."""
    with pltpu.force_tpu_interpret_mode():
        yield


def _sequences(cu):
    """[(row, start, end, first global chunk)] of each sequence, and the number of chunks."""
    out, chunk = [], 0
    spans = [(b, 0, T) for b in range(B)] if cu is None else [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    for row, s, e in spans:
        out.append((row, s, e, chunk if cu is not None else 0))
        chunk += -(-(e - s) // C)
    return out, chunk


def _chunks(s, e):
    """[(chunk index within the sequence, token range)] of a sequence's chunks."""
    return [(c, range(t, min(t + C, e))) for c, t in enumerate(range(s, e, C))]


@functools.cache
def _problem(name):
    """Inputs (numpy float32, FLA's layout) and float64 reference outputs for one config."""
    gate, cu, states, _ = CONFIGS[name]
    rng = np.random.default_rng(7)
    b_, t_ = (1, cu[-1]) if cu is not None else (B, T)
    N = b_ if cu is None else len(cu) - 1
    x = {
        n: rng.standard_normal((b_, t_, H, d)).astype(np.float32) for n, d in (("q", K), ("k", K), ("v", V), ("do", V))
    }
    seqs, NT = _sequences(cu)
    nt_row = NT if cu is not None else -(-T // C)
    g_raw = (-np.logaddexp(0.0, -rng.standard_normal((b_, t_, H))) / 4).astype(np.float32)  # logsigmoid / 4
    gamma = np.array([-0.1, -0.5], np.float32)
    h0 = rng.standard_normal((N, H, K, V)).astype(np.float32) if states else None
    dht = rng.standard_normal((N, H, K, V)).astype(np.float32) if states else None

    # local_cumsum and the natural-log decay a [B, T, H] the stages' gate inputs stand for
    g_cumsum = np.zeros((b_, t_, H))
    for row, s, e, _ in seqs:
        for _, toks in _chunks(s, e):
            g_cumsum[row, toks] = np.cumsum(g_raw[row, toks].astype(np.float64), axis=0)
    g_cumsum *= RCP_LN2
    a = np.zeros((b_, t_, H))
    if gate == "g":
        x["g"] = g_cumsum.astype(np.float32)
        b_nat = x["g"].astype(np.float64) * math.log(2.0)
        for row, s, e, _ in seqs:
            for _, toks in _chunks(s, e):
                a[row, toks] = np.diff(b_nat[row, toks], axis=0, prepend=0.0)
    else:
        x["g_gamma"] = (gamma * np.float32(RCP_LN2)).astype(np.float32)
        a[:] = x["g_gamma"].astype(np.float64) * math.log(2.0)

    f64 = {n: x[n].astype(np.float64) for n in ("q", "k", "v", "do")}
    q, k, v, do = f64["q"], f64["k"], f64["v"], f64["do"]
    h = np.zeros((b_, nt_row, H, K, V))
    dh = np.zeros((b_, nt_row, H, K, V))
    ht = np.zeros((N, H, K, V))
    dh0 = np.zeros((N, H, K, V))
    for n, (row, s, e, c0) in enumerate(seqs):
        for hd in range(H):
            St = np.zeros((K, V)) if h0 is None else h0[n, hd].astype(np.float64)
            for c, toks in _chunks(s, e):
                h[row, c0 + c, hd] = St
                for t in toks:
                    St = np.exp(a[row, t, hd]) * St + np.outer(k[row, t, hd], v[row, t, hd])
            ht[n, hd] = St
            R = np.zeros((K, V)) if dht is None else dht[n, hd].astype(np.float64)
            for c, toks in reversed(_chunks(s, e)):
                dh[row, c0 + c, hd] = R
                for t in reversed(toks):
                    R = np.exp(a[row, t, hd]) * (R + SCALE * np.outer(q[row, t, hd], do[row, t, hd]))
            dh0[n, hd] = R
    # the stages get h and dh as float32 (FLA's op passes them in float32 here)
    x["h"], x["dh"] = h.astype(np.float32), dh.astype(np.float32)
    h, dh = x["h"].astype(np.float64), x["dh"].astype(np.float64)

    # per chunk from the given h and dh: o, dv, dq, dk, dg
    o, dv = np.zeros_like(v), np.zeros_like(v)
    dq, dk, dg = np.zeros_like(q), np.zeros_like(k), np.zeros((b_, t_, H))
    for row, s, e, c0 in seqs:
        for hd in range(H):
            for c, toks in _chunks(s, e):
                St, states_t = h[row, c0 + c, hd], {}
                for t in toks:
                    St = np.exp(a[row, t, hd]) * St + np.outer(k[row, t, hd], v[row, t, hd])
                    states_t[t] = St
                    o[row, t, hd] = SCALE * q[row, t, hd] @ St
                    dq[row, t, hd] = SCALE * St @ do[row, t, hd]
                R, da = dh[row, c0 + c, hd], {}
                for t in reversed(toks):
                    G = R + SCALE * np.outer(q[row, t, hd], do[row, t, hd])
                    dv[row, t, hd] = k[row, t, hd] @ G
                    dk[row, t, hd] = G @ v[row, t, hd]
                    da[t] = np.sum(G * (states_t[t] - np.outer(k[row, t, hd], v[row, t, hd])))
                    R = np.exp(a[row, t, hd]) * G
                # a_t = b_t - b_{t-1} inside the chunk: d/db_t = da_t - da_{t+1}
                for t in toks:
                    dg[row, t, hd] = da[t] - da.get(t + 1, 0.0)
    ref = {
        "g_cumsum": g_cumsum,
        "h": h,
        "ht": ht,
        "o": o,
        "dh": dh,
        "dh0": dh0,
        "dv": dv,
        "dq": dq,
        "dk": dk,
        "dg": dg,
    }
    x.update(g_raw=g_raw, h0=h0, dht=dht, cu_seqlens=None if cu is None else np.asarray(cu, np.int64))
    return x, ref


def _call(name, stage):
    """Run one stage on the config's inputs -> {output name: numpy}."""
    gate, cu, states, jit = CONFIGS[name]
    x, _ = _problem(name)
    cu_j = None if cu is None else jnp.asarray(x["cu_seqlens"], jnp.int32)
    common = dict(cu_seqlens=cu_j, chunk_size=C)
    tensors = {n: (None if x[n] is None else jnp.asarray(x[n])) for n in ("q", "k", "v", "do", "h", "dh", "h0", "dht")}
    tensors["gate"] = jnp.asarray(x[gate])

    def run(t):
        gk = {gate: t["gate"]}
        if stage == "local_cumsum":
            return {"g_cumsum": S.chunk_local_cumsum(t["g_raw"], scale=RCP_LN2, **common)}
        if stage == "fwd_h":
            h, ht = S.chunk_fwd_h(k=t["k"], v=t["v"], h0=t["h0"], output_final_state=states, **gk, **common)
            return {"h": h, "ht": ht}
        if stage == "fwd_o":
            return {"o": S.chunk_fwd_o(q=t["q"], k=t["k"], v=t["v"], h=t["h"], scale=SCALE, **gk, **common)}
        if stage == "bwd_dh":
            dh, dh0 = S.chunk_bwd_dh(
                q=t["q"], k=t["k"], v=t["v"], do=t["do"], h0=t["h0"], dht=t["dht"], scale=SCALE, **gk, **common
            )
            return {"dh": dh, "dh0": dh0}
        if stage == "bwd_dv":
            return {"dv": S.chunk_bwd_dv(q=t["q"], k=t["k"], do=t["do"], dh=t["dh"], scale=SCALE, **gk, **common)}
        dq, dk, dw, dg = S.chunk_bwd_dqkwg(
            q=t["q"], k=t["k"], v=t["v"], do=t["do"], h=t["h"], dh=t["dh"], scale=SCALE, **gk, **common
        )
        assert dw is None
        return {"dq": dq, "dk": dk, "dg": dg}

    tensors["g_raw"] = jnp.asarray(x["g_raw"])
    out = (jax.jit(run) if jit else run)(tensors)
    return {n: (None if a is None else np.asarray(a)) for n, a in out.items()}


def _rel(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


# chunk_local_cumsum is a g-gate stage only (FLA's op has no cumsum for g_gamma)
CALLS = [(n, s) for n in CONFIGS for s in STAGES if s != "local_cumsum" or CONFIGS[n][0] == "g"]


@pytest.mark.parametrize("name,stage", CALLS, ids=[f"{n}-{s}" for n, s in CALLS])
def test_stage_matches_float64_recurrence(name, stage, interpret):
    gate, cu, states, _ = CONFIGS[name]
    _, ref = _problem(name)
    got = _call(name, stage)
    absent = {"ht": not states, "dh0": not states, "dg": gate != "g"}
    for n, a in got.items():
        if absent.get(n):
            assert a is None, n
            continue
        assert a.dtype == np.float32 and a.shape == ref[n].shape, (n, a.dtype, a.shape, ref[n].shape)
        assert _rel(a, ref[n]) < TOL, (n, _rel(a, ref[n]))


def test_fwd_h_then_fwd_o_equals_whole_op(interpret):
    x, _ = _problem("rows-g-h0-ht")
    q, k, v, g_raw, h0 = (jnp.asarray(x[n]) for n in ("q", "k", "v", "g_raw", "h0"))
    g = S.chunk_local_cumsum(g_raw, C, scale=RCP_LN2)
    h, ht = S.chunk_fwd_h(k=k, v=v, g=g, h0=h0, output_final_state=True, chunk_size=C)
    o = S.chunk_fwd_o(q=q, k=k, v=v, h=h, g=g, scale=SCALE, chunk_size=C)
    o_op, ht_op = chunk_simple_gla(
        q, k, v, g=g_raw, scale=SCALE, initial_state=h0, output_final_state=True, chunk_size=C
    )
    assert _rel(np.asarray(o), np.asarray(o_op, np.float64)) < 1e-6
    assert _rel(np.asarray(ht), np.asarray(ht_op, np.float64)) < 1e-6


def test_every_stage_lowers_for_tpu():
    """Each stage traced under jax.jit from shapes alone (bf16, K = 256: two key tiles, varlen,
    chunk 128) holds its Mosaic kernel (jax.export for TPU on this machine)."""
    T_, H_, K_, V_, C_, NT = 200, 2, 256, 128, 128, 3  # chunks of the 70- and 130-token sequences
    common = dict(cu_seqlens=np.array([0, 70, T_], np.int64), chunk_size=C_, scale=0.1)
    q = jax.ShapeDtypeStruct((1, T_, H_, K_), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((1, T_, H_, V_), jnp.bfloat16)
    g = jax.ShapeDtypeStruct((1, T_, H_), jnp.float32)
    h = jax.ShapeDtypeStruct((1, NT, H_, K_, V_), jnp.float32)
    h0 = jax.ShapeDtypeStruct((2, H_, K_, V_), jnp.float32)
    programs = {
        "fwd_h": (lambda k, v, g, h0: S.chunk_fwd_h(k, v, g, h0=h0, output_final_state=True, **common), (q, v, g, h0)),
        "fwd_o": (lambda q, v, h, g: S.chunk_fwd_o(q, q, v, h.astype(q.dtype), g, **common), (q, v, h, g)),
        "bwd_dh": (lambda q, v, g, h0: S.chunk_bwd_dh(q, q, v, v, h0, h0, g=g, **common), (q, v, g, h0)),
        "bwd_dv": (lambda q, v, h, g: S.chunk_bwd_dv(q, q, v, h, g, **common), (q, v, h, g)),
        "bwd_dqk": (lambda q, v, h, g: S.chunk_bwd_dqkwg(q, q, v, v, h, h, g=g, **common), (q, v, h, g)),
    }
    for kernel, (fn, args) in programs.items():
        with compile_for_tpu():
            text = jax.export.export(jax.jit(fn), platforms=["tpu"])(*args).mlir_module()
        assert f"simple_gla_chunk_{kernel}" in text and text.count("tpu_custom_call") == 1, kernel


@pytest.mark.parametrize("reverse", [False, True])
def test_the_local_cumsum_is_compensated_to_about_an_ulp(reverse):
    """chunk_local_cumsum's scan (stage_layout.compensated_cumsum) keeps every prefix sum within an
    ulp of the float64 one over 256 log-sigmoid gates, where a float32 cumsum loses several: FLA's
    own scan on the GPU (a warp's tree, then its warps) loses less than a sequential one, and the
    stage must be at least as accurate."""
    from kernels_jax.common.stage_layout import compensated_cumsum

    g = -np.log1p(np.exp(-np.random.default_rng(7).standard_normal((256, 8)))).astype(np.float32)
    exact = np.cumsum(g[::-1], 0, dtype=np.float64)[::-1] if reverse else np.cumsum(g, 0, dtype=np.float64)
    ulps = lambda x: np.max(np.abs(np.asarray(x, np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32)))
    assert ulps(compensated_cumsum(jnp.asarray(g), 0, reverse)) <= 1.0
    plain = jnp.flip(jnp.cumsum(jnp.flip(jnp.asarray(g), 0), 0), 0) if reverse else jnp.cumsum(jnp.asarray(g), 0)
    assert ulps(plain) > 2.0  # what the compensation is for
