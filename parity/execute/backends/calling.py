"""Calling a kernel in FLA's convention, from numpy inputs, in jax or torch, with gradients.

    simple_gla: fn(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                   output_final_state=False, cu_seqlens=None[, chunk_size=])
    gla:        fn(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
    kda, gdn:   fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
    gdn2:       fn(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
                (v, g, beta or b, w and the states with HV value heads: case.value_heads)
returning (o, final_state). `chunk_size=` is passed when the function accepts it.
A candidate says what it does not support, recorded as `unsupported` with the reason (not an
error, so the gate does not fail it): it raises `NotImplementedError("reason")` (one that jax
or torch raise, e.g. for a missing differentiation rule, stays an error), or the
function has an attribute `supports(case) -> bool | str` (True: supported; False or a
non-empty string, the reason: not supported) that is asked before it is called.
A candidate with the attribute `forward_only = True` (a kernel without a backward, such as
tpu-inference's) is run on the forward of every case: on a forward-and-backward case it is
called for (o, ht) alone, judged on those, and its record says each backward tensor was not
judged (verdict "not-judged"), neither unsupported nor passed (`forward_case`).
Gradients w.r.t. every differentiable input through jax.vjp or torch autograd, with
cotangents do (and dht when the case returns the final state).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import time
from collections.abc import Callable

import numpy as np

from cases import Case, input_shapes, storage_dtype
from cases.stages import STAGE_FUNCTIONS, stage_of
from parity.execute import compile_log
from parity.model.spec import KernelCall, Unsupported

GRAD_NAMES = {
    "q": "dq",
    "k": "dk",
    "v": "dv",
    "g": "dg",
    "g_gamma": "dg_gamma",
    "beta": "dbeta",
    "b": "db",
    "w": "dw",
    "initial_state": "dh0",
}


def differentiable_inputs(case: Case, inputs: dict[str, np.ndarray]) -> list[str]:
    names = ["q", "k", "v", case.gate_name, *case.delta_gates]
    return names + (["initial_state"] if "initial_state" in inputs else [])


def accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def check_candidate_supports(fn: Callable, case: Case) -> None:
    """Unsupported(reason) when a user's candidate says, through its `supports(case)` attribute,
    that it does not run `case`; TypeError when supports returns anything but True, False or a
    non-empty string (the reason)."""
    supports = getattr(fn, "supports", None)
    answer = True if supports is None else supports(case)
    if answer is True:
        return
    if answer is False:
        raise Unsupported(f"supports(case) returned False for {case.id}")
    if isinstance(answer, str) and answer:
        raise Unsupported(answer)
    raise TypeError(f"supports(case) returned {answer!r}: expected True, False or a non-empty string (the reason)")


def forward_only(fn: Callable) -> bool:
    """Whether a user's candidate declares itself forward-only (`fn.forward_only = True`);
    TypeError when the attribute is anything but a bool."""
    answer = getattr(fn, "forward_only", False)
    if not isinstance(answer, bool):
        raise TypeError(f"forward_only = {answer!r}: expected True or False")
    return answer


NOT_JUDGED = "not judged: the candidate is forward-only (forward_only = True), its backward was not run"


def forward_case(fn: Callable, case: Case) -> tuple[Case, dict[str, str]]:
    """(the case fn is run on, {tensor: why it is not judged}): the forward of a
    forward-and-backward case for a forward-only candidate, the case itself otherwise."""
    if not (case.backward and forward_only(fn)):
        return case, {}
    fwd = dataclasses.replace(case, direction="fwd")
    return fwd, {n: NOT_JUDGED for n in case.output_names() if n not in fwd.output_names()}


# a NotImplementedError raised inside these (jax without a differentiation rule, say) is a
# failure of the candidate, not the candidate saying what it does not support
FRAMEWORK_PACKAGES = ("jax", "jaxlib", "torch", "numpy", "triton")


@contextlib.contextmanager
def candidate_declines():
    """A user's candidate raising NotImplementedError("reason") -> Unsupported(reason), unless it
    was raised inside a framework (FRAMEWORK_PACKAGES: the innermost frame decides; jax's
    traceback filtering is turned off meanwhile so that its frames are there to see)."""
    import jax

    filtering = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")
    try:
        yield
    except NotImplementedError as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
        if where.split(".")[0] in FRAMEWORK_PACKAGES:
            raise
        raise Unsupported(str(e) or "the candidate raised NotImplementedError") from None
    finally:
        jax.config.update("jax_traceback_filtering", filtering)


def static_kwargs(case: Case, fn: Callable, cu_seqlens=None) -> dict:
    # scale None (the case's default, K ** -0.5) is passed as None: the kernel's own default is
    # part of what is tested (a kernel that takes it from V instead of K fails where K != V)
    kw = {"scale": case.scale, "output_final_state": case.ht}
    if cu_seqlens is not None:
        kw["cu_seqlens"] = cu_seqlens
    if accepts(fn, "chunk_size"):
        kw["chunk_size"] = case.chunk_size
    return kw


def _call_by_name(fn, diff: dict, kw: dict):
    """fn(q, k, v, <gate>, [beta | b, w], ..., initial_state=...) with the gates passed by keyword."""
    args = {**diff, **kw}
    return fn(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def jax_program(fn: Callable, case: Case) -> Callable:
    """program(diff, cot) -> (outs, grads): the case's computation through fn in jax.

    diff: the differentiable inputs by name (`differentiable_inputs`); cot: (do,) or (do, dht)
    for a backward case, () otherwise; outs: (o,) or (o, ht); grads: {input name: gradient}
    ({} for a forward case). The same program runs in interpret mode (`run_jax`) and is
    compiled for TPU targets (`parity.execute.tpu_compile`). cu_seqlens is closed over as a concrete
    int32 array (kernels plan the packed layout on the host)."""
    import jax
    import jax.numpy as jnp

    cu = None if case.seqlens is None else jnp.asarray(case.cu_seqlens, jnp.int32)
    kw = static_kwargs(case, fn, cu)

    def forward(d):
        o, ht = _call_by_name(fn, d, kw)
        return (o, ht) if case.ht else (o,)

    def program(diff, cot):
        if not case.backward:
            return forward(diff), {}
        outs, vjp = jax.vjp(forward, diff)
        (grads,) = vjp(tuple(c.astype(o.dtype) for c, o in zip(cot, outs)))
        return outs, grads

    return program


def candidate_function(loaded, spec, case: Case) -> Callable:
    """The function a user's candidate runs for `case`: its function for an op case; for a stage
    case, its function when that is the stage's FLA function (chunk_fwd_h, ...), or its stage
    module's function of that name (MODULE:*). Unsupported, saying why, where it gives none."""
    module, function = spec.module_function()
    if case.stage is None:
        if spec.is_stage_module or function in STAGE_FUNCTIONS:
            raise Unsupported(f"{spec.name} gives stages ({module}:{function}), not the whole op {case.op}")
        return loaded
    want = stage_of(case.op, case.stage).function
    if spec.is_stage_module:
        fn = getattr(loaded, want, None)
        if not callable(fn):
            raise Unsupported(f"{module} has no {want}: {spec.name} gives no stage {case.kind}")
        return fn
    if function == want:
        return loaded
    raise Unsupported(f"{spec.name} is {module}:{function}, not {want}, the function of stage {case.kind}")


def candidate_kernel_call(framework: str, spec, fn: Callable, case: Case) -> KernelCall:
    """How a user's candidate (its function `fn` for `case`, candidate_function) is called: its
    module, the function's name (a stage module's: the stage's FLA name), chunk_size passed when it
    accepts one (static_kwargs)."""
    module, function = spec.module_function()
    if case.stage is not None:  # the stage's function of a stage module (MODULE:*) or the one given
        function = stage_of(case.op, case.stage).function
    return KernelCall(framework, module, function, case.chunk_size if accepts(fn, "chunk_size") else None)


def program_structs(case: Case, fn: Callable, sharding=None):
    """(jax_program(fn, case), diff structs, cotangent structs): the program and its arguments as
    ShapeDtypeStructs (on `sharding`), to trace or lower it without inputs."""
    import jax

    shapes = input_shapes(case)
    struct = lambda n: jax.ShapeDtypeStruct(shapes[n], storage_dtype(case, n), sharding=sharding)  # noqa: E731
    diff = {n: struct(n) for n in differentiable_inputs(case, shapes)}
    cot = tuple(struct(n) for n in cotangent_names(case))
    return jax_program(fn, case), diff, cot


def cotangent_names(case: Case) -> list[str]:
    """Inputs that are the cotangents of a backward case: do, and dht when ht is returned."""
    return (["do"] + (["dht"] if case.ht else [])) if case.backward else []


def run_jax(fn: Callable, case: Case, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """(tensors, seconds in fn's forward and backward)."""
    import jax
    import jax.numpy as jnp

    compile_log.install()
    diff = {n: jnp.asarray(inputs[n]) for n in differentiable_inputs(case, inputs)}
    cot = tuple(jnp.asarray(inputs[n]) for n in cotangent_names(case))
    program = jax_program(fn, case)
    t0 = time.perf_counter()
    outs, grads = jax.block_until_ready(program(diff, cot))
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


def run_torch(
    fn: Callable,
    case: Case,
    inputs: dict[str, np.ndarray],
    device: str = "cpu",
    sync: Callable[[], None] = lambda: None,
) -> tuple[dict[str, np.ndarray], float]:
    """(tensors, seconds in fn's forward and backward); tensors that get no gradient are absent."""
    import torch

    names = differentiable_inputs(case, inputs)
    diff = {n: to_torch(inputs[n], device).requires_grad_(case.backward) for n in names}
    cu = inputs.get("cu_seqlens")
    kw = static_kwargs(case, fn, None if cu is None else torch.from_numpy(cu).to(device))
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
