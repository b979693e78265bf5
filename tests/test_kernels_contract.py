"""The one input contract and the one chunk layout of the kernels_jax ops.

The same bad inputs go to every entry point (chunk_simple_gla, fused_chunk_simple_gla,
chunk_gla, chunk_kda, chunk_gdn, chunk_gdn2) and must raise the same error, "<op>: <argument> must ..."; the layout
plan is checked against an independent per-token walk, host and traced alike; head dims off
the tiles (K != V, odd sizes, V = 512) and empty packed sequences run on every op against the
float64 oracle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cases import Case
from cases.inputs import make_inputs
from kernels_jax.common import config
from kernels_jax.common import layout as layout_mod
from kernels_jax.common.validation import NoKernel
from kernels_jax.gdn import chunk_gdn
from kernels_jax.gdn2 import chunk_gdn2
from kernels_jax.gla import chunk_gla
from kernels_jax.kda import chunk_kda
from kernels_jax.simple_gla import chunk_simple_gla, fused_chunk_simple_gla
from parity.execute.backends.calling import run_jax
from tests.helpers import assert_matches_oracle

ENTRY_POINTS = {  # name -> (function, op prefix of its errors, its gate argument)
    "chunk_simple_gla": (chunk_simple_gla, "simple_gla", "g_gamma"),
    "fused_chunk_simple_gla": (fused_chunk_simple_gla, "simple_gla", "g_gamma"),
    "chunk_gla": (chunk_gla, "gla", "g"),
    "chunk_kda": (chunk_kda, "kda", "g"),
    "chunk_gdn": (chunk_gdn, "gdn", "g"),
    "chunk_gdn2": (chunk_gdn2, "gdn2", "g"),
}


def valid_args(entry: str, B=1, T=40, H=2, K=64, V=64, dtype=jnp.float32) -> dict:
    """Valid keyword arguments of an entry point (zeros; log-decays -0.1)."""
    z = lambda *s: jnp.zeros(s, dtype)
    kw = dict(q=z(B, T, H, K), k=z(B, T, H, K), v=z(B, T, H, V), chunk_size=16)
    if entry in ("chunk_simple_gla", "fused_chunk_simple_gla"):
        kw["g_gamma"] = jnp.full((H,), -0.1, jnp.float32)
    else:
        kw["g"] = jnp.full((B, T, H) if entry == "chunk_gdn" else (B, T, H, K), -0.1, jnp.float32)
    if entry in ("chunk_kda", "chunk_gdn"):
        kw["beta"] = jnp.full((B, T, H), 0.5, jnp.float32)
    if entry == "chunk_gdn2":
        kw["b"], kw["w"] = jnp.full((B, T, H, K), 0.5, jnp.float32), jnp.full((B, T, H, V), 0.5, jnp.float32)
    return kw


def _batch2(entry):
    kw = valid_args(entry, B=2, T=20)
    return {**kw, "cu_seqlens": np.array([0, 10, 20])}


BAD = [  # (the message after "<op>: ", a change of the valid arguments)
    ("q must have rank 4", lambda e, kw: {**kw, "q": kw["q"][0]}),
    ("k must have shape (1, 40, 2, 64)", lambda e, kw: {**kw, "k": kw["k"][:, :20]}),
    ("v must have shape [B, T, H, V] = [1, 40, 2, V >= 1]", lambda e, kw: {**kw, "v": kw["v"][:, :20]}),
    ("q must have a float dtype", lambda e, kw: {**kw, "q": kw["q"].astype(jnp.int32)}),
    ("k and v must have q's dtype float32 (one dtype)", lambda e, kw: {**kw, "v": kw["v"].astype(jnp.bfloat16)}),
    ("chunk_size must be one of (16, 32, 64, 128), got 48", lambda e, kw: {**kw, "chunk_size": 48}),
    ("chunk_size must be one of (16, 32, 64, 128), got 256", lambda e, kw: {**kw, "chunk_size": 256}),
    ("chunk_size must be one of (16, 32, 64, 128), got True", lambda e, kw: {**kw, "chunk_size": True}),
    ("scale must be finite and > 0, got -1.0", lambda e, kw: {**kw, "scale": -1.0}),
    ("scale must be None (K ** -0.5) or a Python number", lambda e, kw: {**kw, "scale": "0.1"}),
    ("output_final_state must be a bool", lambda e, kw: {**kw, "output_final_state": "yes"}),
    ("initial_state must have shape (1, 2, 64, 64)", lambda e, kw: {**kw, "initial_state": jnp.zeros((2, 2, 64, 64))}),
    (
        "cu_seqlens must rise from 0 to T = 40 without decreasing, got [0, 10, 30]",
        lambda e, kw: {**kw, "cu_seqlens": np.array([0, 10, 30])},
    ),
    (
        "cu_seqlens must rise from 0 to T = 40 without decreasing, got [0, 30, 10, 40]",
        lambda e, kw: {**kw, "cu_seqlens": np.array([0, 30, 10, 40])},
    ),
    ("cu_seqlens must be an integer array [N + 1]", lambda e, kw: {**kw, "cu_seqlens": np.array([0.0, 40.0])}),
    ("cu_seqlens must have N + 1 >= 2 entries", lambda e, kw: {**kw, "cu_seqlens": np.array([0])}),
    ("cu_seqlens must come with B == 1 (sequences packed along T), got B = 2", lambda e, kw: _batch2(e)),
    # a positive log-decay overflows exp inside a chunk (as in split-decay-overflow)
    ("{gate} must be <= 0 (a log-decay", lambda e, kw: {**kw, ENTRY_POINTS[e][2]: -kw[ENTRY_POINTS[e][2]]}),
    ("{gate} must be finite", lambda e, kw: {**kw, ENTRY_POINTS[e][2]: kw[ENTRY_POINTS[e][2]] * jnp.nan}),
]
NO_KERNEL = [
    ("head dimension K (q, k) = 300 has no kernel: supported 1 to 256", dict(K=300)),
    ("head dimension V (v) = 600 has no kernel: supported 1 to 512", dict(V=600)),
    ("q, k, v dtype float16 has no kernel: supported ['float32', 'bfloat16']", dict(dtype=jnp.float16)),
]


def _call(entry, kw, monkeypatch):
    """Call the entry point with `kw`; reaching the layout plan (past validation) raises Reached."""
    fn = ENTRY_POINTS[entry][0]

    class Reached(Exception):
        pass

    def reached(*a, **k):
        raise Reached

    monkeypatch.setattr(config, "plan", reached)
    kw = dict(kw)
    return fn(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw), Reached


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("message,change", BAD, ids=[m[:40] for m, _ in BAD])
def test_same_bad_input_same_error_on_every_entry_point(entry, message, change, monkeypatch):
    _, op, gate = ENTRY_POINTS[entry]
    expected = f"{op}: " + message.format(gate=gate)
    with pytest.raises(ValueError) as err:
        _call(entry, change(entry, valid_args(entry)), monkeypatch)
    assert str(err.value).startswith(expected), (str(err.value), expected)
    assert not isinstance(err.value, NoKernel)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("message,dims", NO_KERNEL, ids=[m[:30] for m, _ in NO_KERNEL])
def test_valid_input_without_a_kernel_is_no_kernel(entry, message, dims, monkeypatch):
    op = ENTRY_POINTS[entry][1]
    with pytest.raises(
        NoKernel,
        match="^" + f"{op}: {message}".replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]"),
    ):
        _call(entry, valid_args(entry, **dims), monkeypatch)


def _grouped(entry, HV):
    """Valid arguments with HV value heads on H = 2 q, k heads (v, g, beta or b, w and the state)."""
    kw = valid_args(entry)
    B, T, H, K = kw["q"].shape
    kw["v"] = jnp.zeros((B, T, HV, 64), jnp.float32)
    kw["g"] = jnp.full((B, T, HV) + kw["g"].shape[3:], -0.1, jnp.float32)
    if entry == "chunk_gdn2":
        kw["b"], kw["w"] = jnp.full((B, T, HV, K), 0.5, jnp.float32), jnp.full((B, T, HV, 64), 0.5, jnp.float32)
    else:
        kw["beta"] = jnp.full((B, T, HV), 0.5, jnp.float32)
    return {**kw, "initial_state": jnp.zeros((B, HV, K, 64)), "output_final_state": True}


@pytest.mark.parametrize("entry", ["chunk_kda", "chunk_gdn", "chunk_gdn2"])
def test_grouped_value_heads_are_a_multiple_of_the_q_k_heads(entry, monkeypatch):
    """HV = G * H value heads get past validation; HV = 3 on H = 2 is refused naming v; the other
    ops refuse HV != H (the same message without the grouped alternative)."""
    with pytest.raises(Exception) as err:
        _call(entry, _grouped(entry, 4), monkeypatch)
    assert type(err.value).__name__ == "Reached", err.value
    op = ENTRY_POINTS[entry][1]
    expected = f"{op}: v must have shape [B, T, H, V] = [1, 40, 2, V >= 1], or HV = G * H value heads in place of H"
    with pytest.raises(ValueError) as err:
        _call(entry, _grouped(entry, 3), monkeypatch)
    assert str(err.value).startswith(expected), str(err.value)
    kw = valid_args("chunk_gla")
    with pytest.raises(ValueError, match=r"^gla: v must have shape \[B, T, H, V\] = \[1, 40, 2, V >= 1\], got"):
        _call("chunk_gla", {**kw, "v": jnp.zeros((1, 40, 4, 64))}, monkeypatch)
    bad_state = {**_grouped(entry, 4), "initial_state": jnp.zeros((1, 2, 64, 64))}
    with pytest.raises(ValueError, match=rf"^{op}: initial_state must have shape \(1, 4, 64, 64\)"):
        _call(entry, bad_state, monkeypatch)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_valid_input_gets_past_validation(entry, monkeypatch):
    """The tests above are not vacuous: valid input (an empty packed sequence, any head dims up to
    the limits, K != V) reaches the layout plan on every entry point."""
    for dims in (dict(), dict(K=256, V=512), dict(K=20, V=72), dict(dtype=jnp.bfloat16)):
        kw = {**valid_args(entry, **dims), "cu_seqlens": np.array([0, 10, 10, 40]), "output_final_state": True}
        with pytest.raises(Exception) as err:
            _call(entry, kw, monkeypatch)
        assert type(err.value).__name__ == "Reached", err.value


def test_fused_path_requires_g_gamma(monkeypatch):
    kw = valid_args("chunk_simple_gla")
    kw["g"] = jnp.full(kw["q"].shape[:3], -0.1)
    kw.pop("g_gamma")
    with pytest.raises(ValueError, match="^simple_gla: g_gamma must be given: the fused path"):
        _call("fused_chunk_simple_gla", kw, monkeypatch)
    with pytest.raises(ValueError, match="^simple_gla: g must be None when g_gamma is given"):
        _call("chunk_simple_gla", {**kw, "g_gamma": jnp.full((2,), -0.1)}, monkeypatch)


# ------------------------------------------------------------------------------------------------
# the layout: one plan, host and traced, against a per-token walk


def _walk(B, T, C, cu):
    """Independent reference: chunks of each sequence in order, token by token."""
    cu = np.arange(B + 1) * T if cu is None else np.asarray(cu)
    seq, first, last, length, src = [], [], [], [], []
    for n in range(len(cu) - 1):
        L = cu[n + 1] - cu[n]
        nc = max(1, -(-L // C))
        for j in range(nc):
            real = int(min(C, max(0, L - j * C)))
            seq.append(n), first.append(int(j == 0)), last.append(int(j == nc - 1)), length.append(real)
            src += [int(cu[n] + j * C + i) for i in range(real)] + [B * T] * (C - real)
    return dict(seq=seq, first=first, last=last, length=length, src=src)


@pytest.mark.parametrize(
    "B,T,C,cu",
    [
        (2, 100, 64, None),
        (1, 130, 64, [0, 45, 46, 130]),
        (1, 40, 16, [0, 10, 10, 40]),
        (1, 64, 32, [0, 64]),
        (3, 1, 16, None),
    ],
)
def test_plan_matches_a_token_walk_host_and_traced(B, T, C, cu):
    want = _walk(B, T, C, cu)
    host = layout_mod.plan(B, T, C, None if cu is None else np.asarray(cu, np.int32))
    for name, w in want.items():
        np.testing.assert_array_equal(np.asarray(getattr(host, name)), w, err_msg=name)
    x = jnp.arange(B * T, dtype=jnp.float32).reshape(B, T, 1, 1) + 1
    # every slot holds the token the walk puts there (0 for padding), rows or packed sequences
    walked = np.concatenate([np.asarray(x).reshape(B * T), [0]])[want["src"]].reshape(1, -1, 1)
    np.testing.assert_array_equal(host.pack(x), walked)
    np.testing.assert_array_equal(host.unpack(host.pack(x)), x)
    assert host.rows == (cu is None)
    if cu is None:
        return
    traced = jax.jit(lambda c: layout_mod.plan(B, T, C, c))(jnp.asarray(cu, jnp.int32))
    NT = len(want["seq"])
    assert traced.NT >= NT  # the static bound; the spare chunks are padding of the last sequence
    for name in ("seq", "first", "length"):
        np.testing.assert_array_equal(np.asarray(getattr(traced, name))[:NT], want[name], err_msg=name)
    np.testing.assert_array_equal(np.asarray(traced.src)[: NT * C], want["src"])
    assert np.all(np.asarray(traced.length)[NT:] == 0) and np.asarray(traced.last)[-1] == 1
    np.testing.assert_array_equal(traced.unpack(traced.pack(x)), x)


def test_padded_dim():
    pd = layout_mod.padded_dim
    assert [pd(d, 1) for d in (1, 60, 100, 128, 129, 256, 320, 512)] == [1, 60, 100, 128, 256, 256, 384, 512]
    assert [pd(d, 32) for d in (16, 60, 100, 200)] == [32, 64, 128, 256]
    assert [pd(d, 8) for d in (20, 60, 100)] == [24, 64, 104]


# ------------------------------------------------------------------------------------------------
# every op at head dims off the tiles and with an empty packed sequence, against the oracle

OFF_GRID = [
    # K < V, neither a multiple of 8 or 32; varlen with a length-1 sequence
    "simple_gla-fwdbwd-B1-T50-H1-K20-V72-fp32-C16-g_logsig-h0-ht-lens20_1_29",
    "gla-fwdbwd-B1-T50-H1-K20-V72-fp32-C16-g_logsig-h0-ht-lens20_1_29",
    "kda-fwdbwd-B1-T50-H1-K20-V72-fp32-C16-g_logsig-h0-ht-lens20_1_29",
    # K > V, bf16, V = 12
    "gla-fwdbwd-B2-T24-H2-K72-V12-bf16-C16-g_logsig-h0-ht",
]


@pytest.mark.parametrize("case_id", OFF_GRID)
def test_off_grid_head_dims_match_the_oracle(case_id):
    case = Case.from_id(case_id)
    fn = {"simple_gla": chunk_simple_gla, "gla": chunk_gla, "kda": chunk_kda, "gdn": chunk_gdn}[case.op]
    got, _ = run_jax(fn, case, make_inputs(case))
    assert_matches_oracle(case, got)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_empty_sequence_passes_its_state_through(entry):
    """An empty packed sequence's final state is its initial state, its state gradient is the final
    one's, and the sequences around it are as if it were not there."""
    fn = ENTRY_POINTS[entry][0]
    rng = np.random.default_rng(0)
    kw = valid_args(entry, T=40, K=16, V=16)
    for name in ("q", "k", "v"):
        kw[name] = jnp.asarray(rng.standard_normal(kw[name].shape) * 0.3, jnp.float32)
    h0 = jnp.asarray(rng.standard_normal((3, 2, 16, 16)), jnp.float32)

    def run(cu, h0):
        args = {k: v for k, v in kw.items() if k not in ("q", "k", "v")}
        return fn(
            kw["q"],
            kw["k"],
            kw["v"],
            **args,
            initial_state=h0,
            output_final_state=True,
            cu_seqlens=np.asarray(cu, np.int32),
        )

    o, ht = run([0, 10, 10, 40], h0)
    o2, ht2 = run([0, 10, 40], h0[jnp.array([0, 2])])
    np.testing.assert_array_equal(np.asarray(ht[1]), np.asarray(h0[1]))
    np.testing.assert_allclose(np.asarray(o), np.asarray(o2), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ht[jnp.array([0, 2])]), np.asarray(ht2), rtol=1e-6, atol=1e-6)
    dht = jnp.asarray(rng.standard_normal(ht.shape), jnp.float32)
    dh0 = jax.grad(lambda h: jnp.sum(run([0, 10, 10, 40], h)[1] * dht))(h0)
    np.testing.assert_allclose(np.asarray(dh0[1]), np.asarray(dht[1]), rtol=1e-6, atol=1e-6)
