"""Calling a kernel in FLA's convention, from numpy inputs, in jax or torch, with gradients.

    simple_gla: fn(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                   output_final_state=False, cu_seqlens=None[, chunk_size=])
    gla:        fn(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
    kda:        fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
returning (o, final_state). `chunk_size=` is passed when the function accepts it.
Gradients w.r.t. every differentiable input through jax.vjp or torch autograd, with
cotangents do (and dht when the case returns the final state).
"""
from __future__ import annotations

import inspect
import time
from typing import Callable

import numpy as np

from cases import Case

GRAD_NAMES = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "g_gamma": "dg_gamma", "beta": "dbeta",
              "initial_state": "dh0"}


def differentiable_inputs(case: Case, inputs: dict[str, np.ndarray]) -> list[str]:
    names = ["q", "k", "v", case.gate_name] + (["beta"] if case.op == "kda" else [])
    return names + (["initial_state"] if "initial_state" in inputs else [])


def accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def static_kwargs(case: Case, fn: Callable, inputs: dict[str, np.ndarray]) -> dict:
    kw = {"scale": case.scale_value, "output_final_state": case.ht}
    if "cu_seqlens" in inputs:
        kw["cu_seqlens"] = inputs["cu_seqlens"]
    if accepts(fn, "chunk_size"):
        kw["chunk_size"] = case.chunk_size
    return kw


def _call_by_name(fn, diff: dict, kw: dict):
    """fn(q, k, v, <gate>, [beta], ..., initial_state=...) with the gate passed by keyword."""
    args = {**diff, **kw}
    return fn(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def run_jax(fn: Callable, case: Case, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """(tensors, seconds in fn's forward and backward)."""
    import jax
    import jax.numpy as jnp
    names = differentiable_inputs(case, inputs)
    diff = {n: jnp.asarray(inputs[n]) for n in names}
    kw = static_kwargs(case, fn, inputs)
    if "cu_seqlens" in kw:
        kw["cu_seqlens"] = jnp.asarray(kw["cu_seqlens"], jnp.int32)

    def f(d):
        o, ht = _call_by_name(fn, d, kw)
        return (o, ht) if case.ht else (o,)

    t0 = time.perf_counter()
    if not case.backward:
        outs = jax.block_until_ready(f(diff))
        grads = {}
    else:
        outs, vjp = jax.vjp(f, diff)
        cot = (jnp.asarray(inputs["do"], outs[0].dtype),)
        if case.ht:
            cot += (jnp.asarray(inputs["dht"], outs[1].dtype),)
        (grads,) = vjp(cot)
        outs, grads = jax.block_until_ready((outs, grads))
    seconds = time.perf_counter() - t0
    tensors = {"o": np.asarray(outs[0])}
    if case.ht:
        tensors["ht"] = np.asarray(outs[1])
    tensors.update({GRAD_NAMES[n]: np.asarray(g) for n, g in grads.items()})
    return tensors, seconds


def to_torch(a: np.ndarray, device: str = "cpu"):
    """The exact bits of a numpy array as a torch tensor (bfloat16 through its uint16 view)."""
    import torch
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint16).view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def from_torch(t) -> np.ndarray:
    import ml_dtypes
    import torch
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).view(ml_dtypes.bfloat16)
    return t.numpy()


def run_torch(fn: Callable, case: Case, inputs: dict[str, np.ndarray], device: str = "cpu",
              sync: Callable[[], None] = lambda: None) -> tuple[dict[str, np.ndarray], float]:
    """(tensors, seconds in fn's forward and backward); tensors that get no gradient are absent."""
    import torch
    names = differentiable_inputs(case, inputs)
    diff = {n: to_torch(inputs[n], device).requires_grad_(case.backward) for n in names}
    kw = static_kwargs(case, fn, inputs)
    if "cu_seqlens" in kw:
        kw["cu_seqlens"] = torch.from_numpy(kw["cu_seqlens"]).to(device)
    t0 = time.perf_counter()
    o, ht = _call_by_name(fn, diff, kw)
    if case.backward:
        outs, cots = [o], [to_torch(inputs["do"], device).to(o.dtype)]
        if case.ht:
            outs.append(ht)
            cots.append(to_torch(inputs["dht"], device).to(ht.dtype))
        torch.autograd.backward(outs, cots)
    sync()
    seconds = time.perf_counter() - t0
    tensors = {"o": from_torch(o)}
    if case.ht:
        tensors["ht"] = from_torch(ht)
    if case.backward:
        tensors.update({GRAD_NAMES[n]: from_torch(t.grad) for n, t in diff.items() if t.grad is not None})
    return tensors, seconds
