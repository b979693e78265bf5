"""The adapter's mapping, apart from the harness: gdn2-pallas's entry points as they run on this
host (no TPU: its pure-JAX reference, `gdn2_chunked_wy_reference`) in float32, against the GDN-2
recurrence in torch float64 (FLA's naive_recurrent_gdn2, in float64), outputs and gradients.
Errors ~1e-6 say the adapter maps the convention exactly: what the harness finds is the library."""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gdn2_pallas_adapter as adapter  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def recurrence(q, k, v, g, b, w, scale, h0):
    """S_t = (I - k_t (b_t k_t)^T) Diag(exp(g_t)) S_{t-1} + k_t (w_t v_t)^T, o_t = scale q_t S_t;
    torch float64; HV = G * H value heads read q, k head j // G."""
    G = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(G, 2), k.repeat_interleave(G, 2)
    S, os_ = h0, []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None]
        S = S - k[:, t][..., None] * torch.einsum("bhk,bhkv->bhv", b[:, t] * k[:, t], S)[..., None, :]
        S = S + k[:, t][..., None] * (w[:, t] * v[:, t])[..., None, :]
        os_.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(os_, 1), S


def inputs(B, T, H, HV, K, V, seed=0):
    r = np.random.default_rng(seed)
    q, k = (r.standard_normal((B, T, H, K)) for _ in range(2))
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    v = r.standard_normal((B, T, HV, V))
    g = np.log(1 / (1 + np.exp(-r.standard_normal((B, T, HV, K))))) / 16
    b = 1 / (1 + np.exp(-r.standard_normal((B, T, HV, K))))
    w = 1 / (1 + np.exp(-r.standard_normal((B, T, HV, V))))
    h0 = r.standard_normal((B, HV, K, V))
    return [x.astype(np.float32) for x in (q, k, v, g, b, w, h0)]


def rel(x, r):
    return float(np.linalg.norm(np.asarray(x, np.float64) - r) / np.linalg.norm(r))


@pytest.mark.parametrize("entry", ["gdn2_forward_trainable", "gdn2_forward"])
@pytest.mark.parametrize("H,HV,K,V,C", [(2, 2, 32, 32, 32), (1, 2, 32, 16, 16)])
def test_adapter_matches_the_float64_recurrence(entry, H, HV, K, V, C):
    B, T, scale = 2, 64, 0.3
    x = inputs(B, T, H, HV, K, V)
    fn = getattr(adapter, entry)
    (o, ht), vjp = jax.vjp(
        lambda *a: fn(*a[:6], scale=scale, initial_state=a[6], output_final_state=True, chunk_size=C), *x
    )
    assert adapter.load().is_tpu_available() is False  # this host: the reference path ran
    xt = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in x]
    ro, rh = recurrence(*xt[:6], scale, xt[6])
    assert rel(o, ro.detach().numpy()) < 1e-5 and rel(ht, rh.detach().numpy()) < 1e-5
    r = np.random.default_rng(1)
    do, dht = r.standard_normal(o.shape).astype(np.float32), r.standard_normal(ht.shape).astype(np.float32)
    grads = vjp((do, dht))
    rgrads = torch.autograd.grad(
        (ro, rh), xt, (torch.tensor(do, dtype=torch.float64), torch.tensor(dht, dtype=torch.float64))
    )
    errs = {n: rel(a, rg.numpy()) for n, a, rg in zip(("dq", "dk", "dv", "dg", "db", "dw", "dh0"), grads, rgrads)}
    print(
        f"{entry} H{H} HV{HV} K{K} V{V} C{C}:",
        f"o {rel(o, ro.detach().numpy()):.2e} ht {rel(ht, rh.detach().numpy()):.2e}",
        {n: f"{e:.2e}" for n, e in errs.items()},
    )
    assert max(errs.values()) < 1e-5, errs
