"""The float64 oracle, proven by independent means: a second formulation per op, finite
differences of every gradient, FLA's naive torch recurrences, and varlen == separate runs;
and its default chunked form (references/chunked.py) held to the per-token recurrence (the
definition, references/common.py run_recurrence) at 1e-12 on every tensor."""

import functools

import numpy as np
import pytest

from cases import Case, make_inputs
from parity.measure.compare import rel_rms
from references import chunked, gdn, gdn2, gla, kda, oracle_names, oracle_run, simple_gla

F64_AGREEMENT = 1e-12  # two float64 formulations of the same maths


def f64(x):
    return None if x is None else np.asarray(x, np.float64)


def quadratic_gla(q, k, v, G, scale, h0):
    """Masked-attention form: o_t = scale * sum_{s<=t} (q_t * exp(G_t - G_s)) . k_s v_s
    + scale * (q_t * exp(G_t)) h0, and h_T = exp(G_T) h0 + sum_s exp(G_T - G_s) k_s^T v_s,
    with G the inclusive cumulative sum of the per-channel log-decay [B, T, H, K]."""
    B, T, H, K = q.shape
    D = G[:, :, None] - G[:, None, :]  # [B, t, s, H, K]
    mask = np.tril(np.ones((T, T), bool))[None, :, :, None, None]
    A = np.einsum("bthk,btshk,bshk->bhts", q, np.exp(np.where(mask, D, -np.inf)), k)
    o = scale * np.einsum("bhts,bshv->bthv", A, v)
    ht = np.einsum("bshk,bshv->bhkv", np.exp(G[:, -1:] - G) * k, v)
    if h0 is not None:
        o += scale * np.einsum("bthk,bhkv->bthv", q * np.exp(G), h0)
        ht += np.exp(G[:, -1])[..., None] * h0
    return o, ht


def kda_loop(q, k, v, g, beta, scale, h0):
    """The KDA recurrence as a plain numpy loop over t, b, h."""
    B, T, H, K = q.shape
    S = np.zeros((B, H, K, v.shape[-1])) if h0 is None else h0.copy()
    o = np.zeros(v.shape)
    for t in range(T):
        for b in range(B):
            for h in range(H):
                s = np.exp(g[b, t, h])[:, None] * S[b, h]
                s = s + beta[b, t, h] * np.outer(k[b, t, h], v[b, t, h] - k[b, t, h] @ s)
                S[b, h] = s
                o[b, t, h] = scale * q[b, t, h] @ s
    return o, S


def _args(case):
    x = {n: f64(a) for n, a in make_inputs(case).items() if n not in ("do", "dht")}
    return x


@pytest.mark.parametrize("gate", ["g_logsig", "gamma_alibi", "g_stress"])
def test_simple_gla_equals_quadratic_form(gate):
    c = Case("simple_gla", 2, 70, 3, 16, 8, gate=gate, h0=True, ht=True)
    x = _args(c)
    o, ht = simple_gla.forward(
        x["q"],
        x["k"],
        x["v"],
        g=x.get("g"),
        g_gamma=x.get("g_gamma"),
        scale=c.scale_value,
        initial_state=x["initial_state"],
        output_final_state=True,
    )
    g = x["g"] if "g" in x else np.broadcast_to(x["g_gamma"], (2, 70, 3))
    G = np.broadcast_to(np.cumsum(g, axis=1)[..., None], x["q"].shape)
    o2, ht2 = quadratic_gla(x["q"], x["k"], x["v"], G, c.scale_value, x["initial_state"])
    assert rel_rms(o, o2) < F64_AGREEMENT and rel_rms(ht, ht2) < F64_AGREEMENT


def test_gla_equals_quadratic_form():
    c = Case("gla", 2, 70, 2, 16, 8, h0=True, ht=True)
    x = _args(c)
    o, ht = gla.forward(
        x["q"], x["k"], x["v"], x["g"], scale=0.3, initial_state=x["initial_state"], output_final_state=True
    )
    o2, ht2 = quadratic_gla(x["q"], x["k"], x["v"], np.cumsum(x["g"], axis=1), 0.3, x["initial_state"])
    assert rel_rms(o, o2) < F64_AGREEMENT and rel_rms(ht, ht2) < F64_AGREEMENT


def test_kda_equals_numpy_loop():
    c = Case("kda", 2, 40, 2, 16, 8, h0=True, ht=True)
    x = _args(c)
    o, ht = kda.forward(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        scale=c.scale_value,
        initial_state=x["initial_state"],
        output_final_state=True,
    )
    o2, ht2 = kda_loop(x["q"], x["k"], x["v"], x["g"], x["beta"], c.scale_value, x["initial_state"])
    assert rel_rms(o, o2) < F64_AGREEMENT and rel_rms(ht, ht2) < F64_AGREEMENT


FD_CASES = [
    Case("simple_gla", 1, 9, 2, 4, 3, h0=True, ht=True),
    Case("simple_gla", 1, 9, 2, 4, 3, gate="gamma_alibi", h0=True, ht=True, seqlens=(4, 1, 4)),
    Case("gla", 2, 7, 1, 4, 3, h0=True, ht=True),
    Case("kda", 1, 9, 2, 4, 3, h0=True, ht=True, seqlens=(5, 4)),
    Case("kda", 2, 7, 1, 4, 3, h0=True, ht=True, HV=2),
    Case("gdn", 1, 9, 1, 4, 3, h0=True, ht=True, seqlens=(5, 4), HV=2),
    Case("gdn2", 1, 9, 1, 4, 3, h0=True, ht=True, seqlens=(5, 4), HV=2),
]
MODULES = {"simple_gla": simple_gla, "gla": gla, "kda": kda, "gdn": gdn, "gdn2": gdn2}


@pytest.mark.parametrize("case", FD_CASES, ids=lambda c: c.id)
def test_every_gradient_matches_central_finite_differences(case):
    """<grad_X, D> == (L(X + eps D) - L(X - eps D)) / 2 eps with L = <do, o> + <dht, ht>."""
    from references import _op_kwargs

    x = {n: a if n == "cu_seqlens" else f64(a) for n, a in make_inputs(case).items()}
    kw = _op_kwargs(case, x)
    mod = MODULES[case.op]
    grads = oracle_run(case, make_inputs(case))

    def loss(**over):
        o, ht = mod.forward(**{**kw, **over}, output_final_state=True)
        return float(np.sum(x["do"] * o) + np.sum(x["dht"] * ht))

    rng = np.random.default_rng(0)
    names = {"q": "dq", "k": "dk", "v": "dv", case.gate_name: "d" + case.gate_name, "initial_state": "dh0"}
    names |= {n: "d" + n for n in case.delta_gates}
    for arg, gname in names.items():
        D = rng.standard_normal(np.shape(kw[arg]))
        eps = 1e-6
        fd = (loss(**{arg: kw[arg] + eps * D}) - loss(**{arg: kw[arg] - eps * D})) / (2 * eps)
        an = float(np.sum(grads[gname] * D))
        assert abs(fd - an) <= 1e-6 * max(1.0, abs(an)), (gname, fd, an)


FLA_NAIVE_AGREEMENT = 1e-5  # FLA's naive functions compute in float32 even when given float64


@pytest.mark.parametrize("op, HV", [("simple_gla", None), ("gla", None), ("kda", None), ("kda", 4), ("gdn", None)])
def test_conventions_agree_with_fla_naive_recurrences(op, HV):
    """FLA's naive torch recurrences cast to float32 inside, so agreement is float32-level
    (rel_rms around 1e-6), not float64: this checks conventions (scale, gate, beta, state
    layout, which q, k head a grouped value head reads), not precision."""
    import torch
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.gla.naive import naive_recurrent_gla
    from fla.ops.kda.naive import naive_recurrent_kda
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    c = Case(op, 2, 50, 2, 16, 16, h0=True, ht=True, scale=None, HV=HV)
    x = make_inputs(c)
    t = {n: torch.from_numpy(np.asarray(a, np.float64)) for n, a in x.items()}
    if op == "gdn":  # beta before g
        o2, ht2 = naive_recurrent_gated_delta_rule(
            t["q"], t["k"], t["v"], t["beta"], t["g"], initial_state=t["initial_state"], output_final_state=True
        )
    elif op == "simple_gla":
        o2, ht2 = naive_recurrent_simple_gla(
            t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"], output_final_state=True
        )
    elif op == "gla":
        o2, ht2 = naive_recurrent_gla(
            t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"], output_final_state=True
        )
    else:
        o2, ht2 = naive_recurrent_kda(
            t["q"], t["k"], t["v"], t["g"], t["beta"], initial_state=t["initial_state"], output_final_state=True
        )
    r = oracle_run(c.replace(direction="fwd"), x)
    e_o, e_ht = rel_rms(o2.numpy(), r["o"]), rel_rms(ht2.numpy(), r["ht"])
    assert e_o < FLA_NAIVE_AGREEMENT and e_ht < FLA_NAIVE_AGREEMENT, (e_o, e_ht)


@pytest.mark.parametrize("op", ["simple_gla", "gla", "kda", "gdn", "gdn2"])
def test_varlen_equals_each_sequence_alone(op):
    lens = (5, 1, 17, 9)
    packed = Case(op, 1, sum(lens), 2, 8, 4, seqlens=lens, h0=True, ht=True)
    x = make_inputs(packed)
    r = oracle_run(packed, x)
    cu = packed.cu_seqlens
    for n, (s, e) in enumerate(zip(cu[:-1], cu[1:])):
        one = Case(op, 1, e - s, 2, 8, 4, h0=True, ht=True)
        xi = {
            k: (a[:, s:e] if a.ndim >= 3 and a.shape[:2] == (1, packed.T) else a)
            for k, a in x.items()
            if k != "cu_seqlens"
        }
        xi["initial_state"], xi["dht"] = x["initial_state"][n : n + 1], x["dht"][n : n + 1]
        ri = oracle_run(one, xi)
        for name in ("o", "dq", "dk", "dv", "dg"):
            np.testing.assert_allclose(r[name][:, s:e], ri[name], rtol=1e-12, atol=1e-12, err_msg=name)
        for name in ("ht", "dh0"):
            np.testing.assert_allclose(r[name][n : n + 1], ri[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_oracle_does_not_enable_x64_process_wide():
    import jax

    oracle_run(FD_CASES[0], make_inputs(FD_CASES[0]))
    assert not jax.config.jax_enable_x64


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda x: kda.forward(x["q"], x["k"], x["v"][:, :, :1], x["g"][..., None].repeat(16, -1), x["g"]),
            r"v must have shape \[B, T, HV, V\] = \[1, 16, HV, V\], HV a multiple of H = 2",
        ),
        (lambda x: gdn.forward(x["q"], x["k"], x["v"], x["g"][..., None], x["g"]), r"g must have shape \(1, 16, 2\)"),
        (lambda x: simple_gla.forward(x["q"][..., :8], x["k"], x["v"], g=x["g"]), "k must have the shape of q"),
        (lambda x: simple_gla.forward(x["q"], x["k"], x["v"][:, :5], g=x["g"]), r"v must have shape \[B, T, H, V\]"),
        (lambda x: simple_gla.forward(x["q"], x["k"], x["v"], g=x["g"], g_gamma=np.zeros(2)), "g or g_gamma, not both"),
        (lambda x: simple_gla.forward(x["q"], x["k"], x["v"], g=x["g"][..., :1]), r"g must have shape \(1, 16, 2\)"),
        (lambda x: simple_gla.forward(x["q"][0], x["k"], x["v"], g=x["g"]), "q must have rank 4"),
        (
            lambda x: simple_gla.forward(x["q"], x["k"], x["v"], g=x["g"], cu_seqlens=[1, 16]),
            "cu_seqlens must start at 0",
        ),
        (
            lambda x: simple_gla.forward(x["q"], x["k"], x["v"], g=x["g"], cu_seqlens=[0, 9, 9, 16]),
            "strictly increasing",
        ),
        (lambda x: simple_gla.forward(x["q"], x["k"], x["v"], g=x["g"], cu_seqlens=[0, 9]), "must end at T=16"),
        (
            lambda x: simple_gla.forward(
                np.concatenate([x["q"]] * 2),
                np.concatenate([x["k"]] * 2),
                np.concatenate([x["v"]] * 2),
                g=np.concatenate([x["g"]] * 2),
                cu_seqlens=[0, 16],
            ),
            "requires B == 1",
        ),
        (
            lambda x: simple_gla.forward(x["q"], x["k"], x["v"], g=x["g"], initial_state=np.zeros((2, 2, 16, 16))),
            r"initial_state must have shape \[N, H, K, V\]",
        ),
        (lambda x: kda.forward(x["q"], x["k"], x["v"], x["g"][..., None].repeat(16, -1), None), "beta"),
    ],
)
def test_bad_input_names_the_argument(call, message):
    x = make_inputs(Case("simple_gla", 1, 16, 2, 16, 16))
    with pytest.raises(ValueError, match=message):
        call(x)


@pytest.mark.parametrize("K, V", [(60, 100), (128, 64), (32, 512)])
def test_gla_with_k_not_v_equals_a_numpy_recurrence(K, V):
    """Head dims off the 64 grid, K > V and V = 512: the oracle against the recurrence
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t, o_t = (q_t K^-0.5) S_t written here in numpy."""
    c = Case("gla", 1, 40, 2, K, V, direction="fwd", ht=True, h0=True)
    x = make_inputs(c)
    got = oracle_run(c, x)
    q, k, v, g = (x[n].astype(np.float64) for n in ("q", "k", "v", "g"))
    S = x["initial_state"][0].astype(np.float64)
    o = np.zeros((40, 2, V))
    for t in range(40):
        S = np.exp(g[0, t])[:, :, None] * S + k[0, t][:, :, None] * v[0, t][:, None, :]
        o[t] = np.einsum("hk,hkv->hv", q[0, t] * K**-0.5, S)
    assert np.abs(got["o"][0] - o).max() < 1e-12 and np.abs(got["ht"][0] - S).max() < 1e-12


# ---------------------------------------------------------------- chunked == recurrence
# The chunked form against the recurrence on every tensor oracle_run returns: several chunks
# with a padded last one (T not a multiple of the chunk), varlen with length-1 sequences,
# T = 1, K != V, h0 / ht on and off, per-token and per-head gates (dg_gamma and its terms),
# the stress gates at the fuzzer's largest magnitude (6) and far past it (40: decays that
# underflow inside a chunk), the steepest logsigmoid gates, kda's beta, bf16 inputs, fwd.
CHUNKED_CASES = [
    Case("simple_gla", 2, 150, 2, 16, 8, h0=True, ht=True),
    Case(
        "simple_gla", 1, 90, 3, 8, 8, gate="gamma_stress", gate_params={"mag": 6}, h0=True, ht=True, seqlens=(1, 70, 19)
    ),
    Case("simple_gla", 1, 100, 4, 8, 8, gate="gamma_alibi", gate_params={"layers": 4}, h0=True, seqlens=(64, 36)),
    Case("simple_gla", 1, 1, 2, 8, 4, gate="gamma_retnet", h0=True, ht=True, dtype="bfloat16"),
    Case("simple_gla", 2, 70, 2, 8, 16, gate="g_stress", gate_params={"mag": 40}, ht=True, direction="fwd"),
    Case("gla", 2, 37, 2, 16, 8, h0=True, ht=True),
    Case("gla", 1, 50, 2, 8, 12, gate="g_stress", gate_params={"mag": 6}, h0=True, ht=True, seqlens=(16, 1, 33)),
    Case("gla", 1, 40, 2, 8, 8, gate="g_stress", gate_params={"mag": 40}, ht=True),
    Case("gla", 1, 1, 1, 4, 4, direction="fwd", h0=True),
    Case("gla", 2, 32, 2, 8, 8, h0=True, ht=True),  # every chunk full: no padding
    Case("kda", 2, 37, 2, 16, 8, h0=True, ht=True),
    Case("kda", 1, 50, 2, 8, 12, gate="g_stress", gate_params={"mag": 6}, h0=True, ht=True, seqlens=(16, 1, 33)),
    Case("kda", 1, 1, 2, 8, 4, h0=True, ht=True, dtype="bfloat16"),
    Case("kda", 2, 40, 1, 32, 32, gate_params={"norm": 1}, h0=True, direction="fwd"),
    Case("kda", 2, 37, 1, 16, 8, h0=True, ht=True, HV=3),
    Case("kda", 1, 50, 2, 8, 12, gate="g_stress", gate_params={"mag": 6}, h0=True, ht=True, seqlens=(16, 1, 33), HV=4),
    Case("gdn", 2, 150, 2, 16, 8, h0=True, ht=True),
    Case("gdn", 1, 90, 1, 8, 8, gate="g_stress", gate_params={"mag": 6}, h0=True, ht=True, seqlens=(1, 70, 19), HV=2),
    Case("gdn", 2, 70, 2, 8, 16, gate="g_stress", gate_params={"mag": 40}, ht=True, direction="fwd", HV=4),
    Case("gdn", 1, 1, 2, 8, 4, h0=True, ht=True, dtype="bfloat16"),
    Case("gdn2", 2, 37, 2, 16, 8, h0=True, ht=True),
    Case("gdn2", 1, 50, 2, 8, 12, gate="g_stress", gate_params={"mag": 6}, h0=True, ht=True, seqlens=(16, 1, 33), HV=4),
    Case("gdn2", 1, 40, 1, 8, 8, gate="g_stress", gate_params={"mag": 40}, ht=True, HV=2),
    Case("gdn2", 1, 1, 2, 8, 4, h0=True, ht=True, dtype="bfloat16"),
    Case("gdn2", 2, 40, 1, 32, 16, gate_params={"norm": 1}, h0=True, direction="fwd"),
]


@functools.cache
def _recurrence(case: Case) -> dict:
    return oracle_run(case, make_inputs(case), method="recurrence")


def _assert_agrees(case: Case, got: dict):
    ref = _recurrence(case)
    assert sorted(got) == sorted(ref) == sorted(oracle_names(case))
    errs = {n: rel_rms(got[n], ref[n]) for n in ref}
    assert max(errs.values()) < F64_AGREEMENT, errs


@pytest.mark.parametrize("case", CHUNKED_CASES, ids=lambda c: c.id)
def test_chunked_equals_recurrence(case):
    _assert_agrees(case, oracle_run(case, make_inputs(case)))


@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("case", [c for c in CHUNKED_CASES if c.seqlens and c.backward], ids=lambda c: c.id)
def test_chunked_equals_recurrence_at_any_chunk_size(case, chunk, monkeypatch):
    """The chunk size only regroups the same sums: 1 (token by token, like the recurrence),
    5 and 64 (sequences longer and shorter than a chunk)."""
    monkeypatch.setattr(chunked, "CHUNK_HEAD_GATE", chunk)
    monkeypatch.setattr(chunked, "CHUNK_CHANNEL_GATE", chunk)
    _assert_agrees(case, oracle_run(case, make_inputs(case)))


def test_chunked_is_the_default_and_methods_are_checked():
    """oracle_run's default is the chunked form; an unknown method is refused."""
    c = Case("gla", 1, 9, 1, 4, 4, direction="fwd")
    x = make_inputs(c)
    a, b = oracle_run(c, x), oracle_run(c, x, method="chunked")
    assert all(np.array_equal(a[n], b[n]) for n in a)
    with pytest.raises(ValueError, match="method must be one of"):
        oracle_run(c, x, method="scan")


# ---------------------------------------------------------------- grouped value heads, gdn
# Two second formulations: a case with HV = G * H value heads is the HV-head case on q, k
# repeated G times per head (FLA's repeat_interleave; dq, dk summed over each group), and gdn
# is kda with its per-head log-decay on every key channel (dg summed over K). Both sides by
# the recurrence (the grouped one reads q, k through its grouped einsum, never a repeat).
GROUPED_CASES = [
    Case("kda", 2, 23, 2, 8, 4, h0=True, ht=True, HV=4),
    Case("gdn", 1, 30, 1, 8, 4, h0=True, ht=True, seqlens=(11, 1, 18), HV=3, gate="g_stress"),
    Case("gdn2", 1, 30, 1, 8, 4, h0=True, ht=True, seqlens=(11, 1, 18), HV=2),
]


@pytest.mark.parametrize("case", GROUPED_CASES, ids=lambda c: c.id)
def test_grouped_value_heads_equal_repeated_q_and_k(case):
    x = make_inputs(case)
    got = oracle_run(case, x, method="recurrence")
    flat = case.replace(H=case.value_heads, HV=None)
    x_flat = {n: np.repeat(a, case.G, axis=2) if n in ("q", "k") else a for n, a in x.items()}
    ref = oracle_run(flat, x_flat, method="recurrence")
    for n in ("dq", "dk"):
        ref[n] = ref[n].reshape(ref[n].shape[:2] + (case.H, case.G, case.K)).sum(3)
    errs = {n: rel_rms(got[n], ref[n]) for n in oracle_names(case)}
    assert max(errs.values()) < F64_AGREEMENT, errs


@pytest.mark.parametrize("method", ["chunked", "recurrence"])
def test_gdn_equals_kda_with_the_gate_broadcast(method):
    case = Case("gdn", 1, 70, 1, 8, 4, h0=True, ht=True, HV=2, seqlens=(33, 37))
    x = make_inputs(case)
    got = oracle_run(case, x, method=method)
    x_kda = dict(x, g=np.ascontiguousarray(np.broadcast_to(x["g"][..., None], x["g"].shape + (case.K,))))
    ref = oracle_run(case.replace(op="kda"), x_kda, method=method)
    ref["dg"] = ref["dg"].sum(-1)
    errs = {n: rel_rms(got[n], ref[n]) for n in oracle_names(case)}
    assert max(errs.values()) < F64_AGREEMENT, errs


# ---------------------------------------------------------------- gdn2
# GDN-2 with b = beta on every key channel and w = beta on every value channel is kda (dbeta = the
# sum over K of db plus the sum over V of dw), by either method; and its recurrence is FLA's
# naive_recurrent_gdn2 computed in float64.
@pytest.mark.parametrize("method", ["chunked", "recurrence"])
def test_gdn2_with_b_and_w_beta_equals_kda(method):
    case = Case("kda", 1, 70, 1, 8, 4, h0=True, ht=True, HV=2, seqlens=(33, 37))
    x = make_inputs(case)
    ref = oracle_run(case, x, method=method)
    beta = x["beta"][..., None]
    x2 = {n: a for n, a in x.items() if n != "beta"}
    x2["b"] = np.ascontiguousarray(np.broadcast_to(beta, beta.shape[:-1] + (case.K,)))
    x2["w"] = np.ascontiguousarray(np.broadcast_to(beta, beta.shape[:-1] + (case.V,)))
    got = oracle_run(case.replace(op="gdn2"), x2, method=method)
    got["dbeta"] = got.pop("db").sum(-1) + got.pop("dw").sum(-1)
    errs = {n: rel_rms(got[n], ref[n]) for n in oracle_names(case)}
    assert max(errs.values()) < F64_AGREEMENT, errs


def test_gdn2_recurrence_equals_fla_naive_in_float64(monkeypatch):
    """FLA's naive_recurrent_gdn2 run in float64: its .float() casts and float32 buffers made float64
    for the call (torch.Tensor.float and the module's torch.float32), so the two definitions agree to
    float64 rounding, forward and final state, with h0 and a scale."""
    import types

    import torch
    from fla.ops.gdn2 import naive as fla_naive

    monkeypatch.setattr(torch.Tensor, "float", lambda self: self.double())
    proxy = types.SimpleNamespace(**{n: getattr(torch, n) for n in ("zeros", "float32")})
    proxy.float32 = torch.float64
    monkeypatch.setattr(fla_naive, "torch", proxy)
    c = Case("gdn2", 2, 30, 2, 16, 8, h0=True, ht=True, scale=0.3, direction="fwd")
    x = make_inputs(c)
    t = {n: torch.from_numpy(np.asarray(a, np.float64)) for n, a in x.items()}
    o2, ht2 = fla_naive.naive_recurrent_gdn2(
        t["q"], t["k"], t["v"], t["g"], t["b"], t["w"], 0.3, initial_state=t["initial_state"], output_final_state=True
    )
    assert o2.dtype == ht2.dtype == torch.float64
    r = oracle_run(c, x, method="recurrence")
    e_o, e_ht = rel_rms(o2.numpy(), r["o"]), rel_rms(ht2.numpy(), r["ht"])
    assert e_o < F64_AGREEMENT and e_ht < F64_AGREEMENT, (e_o, e_ht)
