"""kernels_jax.gdn2.chunk_gdn2 (GDN-2: KDA's kernels with a per-K-channel erase gate b and a
per-V-channel write gate w; Pallas, TPU interpret mode here) against a float64 recurrence
written here in torch (FLA's naive_recurrent_gdn2, fla/ops/gdn2/naive.py, step for step, in
float64: FLA's own casts to float32), forward and every gradient (jax.vjp against torch
autograd); chunk_gdn2 at b = beta 1_K, w = beta 1_V against chunk_kda; and forward plus backward
compiled by the real TPU compiler for v5e, v6e and TPU7x.

Shapes are small: compiling an interpret-mode kernel dominates the time.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from kernels_jax.gdn2 import chunk_gdn2
from kernels_jax.kda import chunk_kda
from parity.model import targets
from tests.helpers import requires_libtpu

GRADS = ("dq", "dk", "dv", "dg", "db", "dw", "dh0")
KERNELS = ("gdn2_intra", "gdn2_recurrence_fwd", "gdn2_recurrence_bwd", "gdn2_chunk_grads")


def make_inputs(B, T, H, HV, K, V, N, dtype, seed=0):
    """q, k (L2-normalised) in dtype, v in dtype, g = logsigmoid(x) (down to about -4), b, w in
    (0, 1), h0 and the cotangents do, dht; numpy, the case dtype's values exactly."""
    rng = np.random.default_rng(seed)
    normal = lambda *s: rng.standard_normal(s).astype(np.float32)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    cast = lambda x: np.asarray(jnp.asarray(x, dtype))
    sigmoid = lambda x: 1.0 / (1.0 + np.exp(-x))
    return {
        "q": cast(unit(normal(B, T, H, K))),
        "k": cast(unit(normal(B, T, H, K))),
        "v": cast(normal(B, T, HV, V)),
        "g": -np.logaddexp(0.0, -2.0 * normal(B, T, HV, K)).astype(np.float32),
        "b": sigmoid(normal(B, T, HV, K)).astype(np.float32),
        "w": sigmoid(normal(B, T, HV, V)).astype(np.float32),
        "h0": normal(N, HV, K, V),
        "do": cast(normal(B, T, HV, V)),
        "dht": normal(N, HV, K, V),
    }


def reference(x, scale, cu_seqlens=None):
    """o, ht and every gradient of sum(o * do) + sum(ht * dht), by the float64 recurrence of
    FLA's naive_recurrent_gdn2 per sequence (value head j reads q, k head j // G)."""
    t = {n: torch.tensor(np.asarray(a, np.float64), requires_grad=n not in ("do", "dht")) for n, a in x.items()}
    B, T, H, K = x["q"].shape
    HV = x["v"].shape[2]
    G = HV // H
    cu = list(range(0, B * T + 1, T)) if cu_seqlens is None else list(cu_seqlens)
    flat = lambda n: t[n].reshape((B * T,) + t[n].shape[2:])
    q, k = (flat(n).repeat_interleave(G, dim=1) for n in ("q", "k"))
    v, g, b, w = (flat(n) for n in ("v", "g", "b", "w"))
    outs, finals = [], []
    for n, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
        S = t["h0"][n]  # [HV, K, V]
        for i in range(start, end):
            S = S * torch.exp(g[i])[..., None]
            erase = torch.einsum("hk,hkv->hv", b[i] * k[i], S)
            S = S + k[i][..., None] * (w[i] * v[i] - erase)[:, None, :]
            outs.append(scale * torch.einsum("hk,hkv->hv", q[i], S))
        finals.append(S)
    o = torch.stack(outs).reshape(B, T, HV, -1)
    ht = torch.stack(finals)
    loss = (o * t["do"]).sum() + (ht * t["dht"]).sum()
    grads = torch.autograd.grad(loss, [t[n] for n in ("q", "k", "v", "g", "b", "w", "h0")])
    ref = {"o": o.detach().numpy(), "ht": ht.detach().numpy()}
    ref.update({name: d.numpy() for name, d in zip(GRADS, grads)})
    return ref


def run_kernel(fn, x, gates, *, chunk_size, cu_seqlens=None):
    """fn's o, ht and its vjp at (do, dht) on the numpy inputs, as float32 numpy arrays."""
    names = ("q", "k", "v", "g", *gates, "h0")
    cu = None if cu_seqlens is None else jnp.asarray(cu_seqlens, jnp.int32)

    def f(*args):
        *a, h0 = args
        return fn(*a, initial_state=h0, output_final_state=True, cu_seqlens=cu, chunk_size=chunk_size)

    (o, ht), vjp = jax.vjp(f, *(jnp.asarray(x[n]) for n in names))
    grads = vjp((jnp.asarray(x["do"]), jnp.asarray(x["dht"])))
    out = {"o": o, "ht": ht, **{"d" + n: d for n, d in zip(names, grads)}}
    out["dh0"] = out.pop("dh0")
    return {n: np.asarray(jnp.asarray(a, jnp.float32)) for n, a in out.items()}


def relative_errors(got, ref):
    """max |got - ref| / max |ref| per tensor."""
    return {n: float(np.max(np.abs(got[n] - ref[n])) / max(np.max(np.abs(ref[n])), 1e-30)) for n in ref}


CONFIGS = {  # name: (B, T, H, HV, K, V, chunk_size, cu_seqlens, dtype)
    # T 64, two chunks of 32, batch 2, grouped value heads (HV = 2 H)
    "T64-B2-HV2H": (2, 64, 1, 2, 32, 16, 32, None, jnp.float32),
    # T 50 off the chunk (16), head dims off the tiles (K 20, V 24 padded to 24, 24)
    "T50-C16-K20-V24": (1, 50, 2, 2, 20, 24, 16, None, jnp.float32),
    # packed sequences with unaligned boundaries and a length-1 sequence, bf16, HV = 2 H
    "varlen-bf16": (1, 70, 1, 2, 16, 32, 32, (0, 23, 24, 70), jnp.bfloat16),
}
# measured (max error / max |reference|): float32 at most 2.5e-7; bf16 o, dq, dk, dv (returned in
# bf16) 3.5e-3, the float32 ones 1.5e-7. A mutant building A_kk without b misses by 2e-2 to 1e-1.
FP32_BOUND, BF16_BOUND = 1e-5, 1e-2
IN_CASE_DTYPE = ("o", "dq", "dk", "dv")  # returned in q's dtype


@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_float64_recurrence(name):
    """o, ht and dq, dk, dv, dg, db, dw, dh0 within their bound (max error relative to the largest
    reference value: 1e-5, or 1e-2 for what is returned in bf16) of the float64 recurrence on the
    same (dtype-rounded) inputs."""
    B, T, H, HV, K, V, C, cu, dtype = CONFIGS[name]
    N = B if cu is None else len(cu) - 1
    x = make_inputs(B, T, H, HV, K, V, N, dtype)
    got = run_kernel(chunk_gdn2, x, ("b", "w"), chunk_size=C, cu_seqlens=cu)
    ref = reference(x, K**-0.5, cu)
    errors = relative_errors(got, ref)
    assert all(np.isfinite(got[n]).all() for n in got)
    bound = lambda n: BF16_BOUND if dtype == jnp.bfloat16 and n in IN_CASE_DTYPE else FP32_BOUND
    assert all(e < bound(n) for n, e in errors.items()), errors


def test_without_initial_or_final_state():
    """No initial state (zeros), no final state asked: None back, o as with h0 = 0."""
    x = make_inputs(1, 20, 1, 1, 8, 8, 1, jnp.float32)
    args = [jnp.asarray(x[n]) for n in ("q", "k", "v", "g", "b", "w")]
    o, ht = chunk_gdn2(*args, chunk_size=16)
    assert ht is None
    ref = reference({**x, "h0": np.zeros_like(x["h0"])}, 8**-0.5)
    np.testing.assert_allclose(np.asarray(o), ref["o"], rtol=0, atol=1e-5)


def test_equals_kda_when_both_gates_are_beta():
    """b = beta 1_K, w = beta 1_V is KDA: chunk_gdn2 against chunk_kda (HV = 2 H, T off the
    chunk), kernels written apart (GDN-2's WY form with the gates inside A_kk's sum; KDA's stage
    kernels, FLA's split), so o, ht and the gradients agree to float32 rounding;
    dbeta = sum_K db + sum_V dw."""
    B, T, H, HV, K, V = 1, 40, 1, 2, 16, 16
    x = make_inputs(B, T, H, HV, K, V, B, jnp.float32, seed=3)
    beta = x["b"][..., :1]
    x.update(b=np.repeat(beta, K, axis=-1), w=np.repeat(beta, V, axis=-1), beta=beta[..., 0])
    got = run_kernel(chunk_gdn2, x, ("b", "w"), chunk_size=16)
    ref = run_kernel(chunk_kda, x, ("beta",), chunk_size=16)
    got["dbeta"] = got.pop("db").sum(-1) + got.pop("dw").sum(-1)
    for n in ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"):
        np.testing.assert_allclose(got[n], ref[n], rtol=1e-5, atol=1e-5, err_msg=n)


def test_gates_are_checked():
    """The gates' own contract (the rest is test_kernels_contract.py's): b [B, T, HV, K] and
    w [B, T, HV, V] are required, of these shapes, and beta is not taken."""
    x = make_inputs(1, 20, 1, 2, 8, 16, 1, jnp.float32)
    args = {n: jnp.asarray(x[n]) for n in ("q", "k", "v", "g", "b", "w")}
    with pytest.raises(ValueError, match=r"^gdn2: w must have shape \(1, 20, 2, 16\), got \(1, 20, 2, 8\)"):
        chunk_gdn2(**{**args, "w": args["b"]})
    with pytest.raises(ValueError, match=r"^gdn2: b must have shape \(1, 20, 2, 8\)"):
        chunk_gdn2(**{**args, "b": args["b"][:, :, :1]})
    with pytest.raises(ValueError, match=r"^gdn2: b must be given"):
        chunk_gdn2(**{**args, "b": None})


@requires_libtpu
@pytest.mark.parametrize("target", list(targets.DEFAULT_TARGETS))
def test_compiles_for_tpu(target):
    """Forward and backward (jax.vjp), varlen with traced cu_seqlens, bf16, HV = 2 H, K 64,
    V 128: the real TPU compiler (XLA:TPU and Mosaic, compile-only) accepts the program for the
    target, the four Mosaic kernels are in the compiled module and their matmuls agree with the
    TPU numerics model."""
    from parity.execute import tpu_compile

    B, T, H, HV, K, V, N = 1, 100, 1, 2, 64, 128, 2

    def program(q, k, v, g, b, w, h0, cu, do, dht):
        f = lambda q, k, v, g, b, w, h0: chunk_gdn2(
            q, k, v, g, b, w, initial_state=h0, output_final_state=True, cu_seqlens=cu
        )
        outs, vjp = jax.vjp(f, q, k, v, g, b, w, h0)
        return outs, vjp((do, dht))

    def program_and_args(sharding):
        s = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
        bf16 = jnp.bfloat16
        args = (
            s((B, T, H, K), bf16),
            s((B, T, H, K), bf16),
            s((B, T, HV, V), bf16),
            s((B, T, HV, K)),
            s((B, T, HV, K)),
            s((B, T, HV, V)),
            s((N, HV, K, V)),
            s((N + 1,), jnp.int32),
            s((B, T, HV, V), bf16),
            s((N, HV, K, V)),
        )
        return program, args

    t0 = time.perf_counter()
    r = tpu_compile.compile_program(program_and_args, target)
    print(f"gdn2 fwd+bwd compile for {target}: {time.perf_counter() - t0:.1f} s")
    assert r["ok"], r.get("error")
    assert sorted(r["kernels"]) == sorted(KERNELS), r["kernels"]
    # the compiled matmul classes agree with the TPU numerics model (as the suites' compile gate)
    assert not r["numerics"].get("error") and not r["numerics"]["mismatches"], r["numerics"]
