"""The adapter's mapping, apart from the harness: ejkernel's gated_delta_rule as it runs on this host
in float32 (T > 1: its XLA chunked-WY recurrence; T = 1 decode: its Pallas kernel, run here in jax's
TPU interpret mode, `pltpu.force_tpu_interpret_mode`, as nothing else gives it an interpret flag),
against the gated delta rule in torch float64, outputs and gradients. Errors ~1e-6 say the adapter
maps the convention exactly: what the harness finds is the library."""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from jax.experimental.pallas import tpu as pltpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ejkernel_gdn_adapter as adapter  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def recurrence(q, k, v, g, beta, scale, h0):
    """S_t = (I - beta_t k_t k_t^T) exp(g_t) S_{t-1} + beta_t k_t v_t^T, o_t = scale q_t S_t;
    torch float64; HV = G * H value heads read q, k head j // G."""
    G = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(G, 2), k.repeat_interleave(G, 2)
    S, os_ = h0, []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None, None]
        u = beta[:, t][..., None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S))
        S = S + k[:, t][..., None] * u[..., None, :]
        os_.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(os_, 1), S


def inputs(B, T, H, HV, K, V, seed=0):
    r = np.random.default_rng(seed)
    q, k = (r.standard_normal((B, T, H, K)) for _ in range(2))
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    v = r.standard_normal((B, T, HV, V))
    g = np.log(1 / (1 + np.exp(-r.standard_normal((B, T, HV))))) / 16
    beta = 1 / (1 + np.exp(-r.standard_normal((B, T, HV))))
    h0 = r.standard_normal((B, HV, K, V))
    return [x.astype(np.float32) for x in (q, k, v, g, beta, h0)]


def rel(x, r):
    return float(np.linalg.norm(np.asarray(x, np.float64) - r) / np.linalg.norm(r))


@pytest.mark.parametrize(
    "T,H,HV,K,V,C,scale", [(64, 2, 2, 32, 32, 32, 0.3), (50, 1, 2, 32, 16, 16, None), (1, 1, 2, 32, 16, 64, 0.3)]
)
def test_adapter_matches_the_float64_recurrence(T, H, HV, K, V, C, scale):
    B = 2
    x = inputs(B, T, H, HV, K, V)

    def run():
        return jax.vjp(
            lambda *a: adapter.gated_delta_rule(
                *a[:5], scale=scale, initial_state=a[5], output_final_state=True, chunk_size=C
            ),
            *x,
        )

    with pltpu.force_tpu_interpret_mode() if T == 1 else _nothing():
        (o, ht), vjp = run()
        r = np.random.default_rng(1)
        do, dht = r.standard_normal(o.shape).astype(np.float32), r.standard_normal(ht.shape).astype(np.float32)
        grads = vjp((do, dht))
    xt = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in x]
    ro, rh = recurrence(*xt[:5], K**-0.5 if scale is None else scale, xt[5])
    rgrads = torch.autograd.grad(
        (ro, rh), xt, (torch.tensor(do, dtype=torch.float64), torch.tensor(dht, dtype=torch.float64))
    )
    errs = {n: rel(a, rg.numpy()) for n, a, rg in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, rgrads)}
    errs.update(o=rel(o, ro.detach().numpy()), ht=rel(ht, rh.detach().numpy()))
    print(f"T{T} H{H} HV{HV} K{K} V{V} C{C}:", {n: f"{e:.2e}" for n, e in errs.items()})
    assert max(errs.values()) < 1e-5, errs


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
