"""Calling a stage function (cases.stages) the way FLA's op calls it, from torch or jax.

Every stage backend (FLA's stage functions, kernels_jax's stage modules, a user's stage
candidate) is called with keyword arguments under FLA 0.6.0's names: the stage's tensor inputs
(cases.stages.stage_input_names; an optional one the case has none of, h0 say, passed as None,
as FLA's op passes it), cu_seqlens (int64 for torch, int32 for jax) or None, and its other
arguments as FLA's op passes them (cases.stages.stage_kwargs: chunk_size, scale, output_final_state,
states_in_fp32, ...). It returns what FLA's function returns: one tensor, or a tuple in FLA's order
(`Stage.outputs`), from which the case's outputs are taken by name, with what FLA's function
leaves undefined set to 0 (cases.stages.defined_part).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from cases import Case
from cases.stages import (
    defined_part,
    stage_arguments,
    stage_dtype,
    stage_input_names,
    stage_kwargs,
    stage_of,
    stage_shapes,
)
from parity.execute.backends.calling import from_torch, program_structs, to_torch
from parity.measure.tol import NP_DTYPES


def call_kwargs(case: Case, tensors: dict, cu_seqlens) -> dict:
    """The keyword arguments of the stage call: `tensors` (the stage inputs by name, already in
    the framework's arrays), None for an optional input the case has none of, and the case's
    other arguments (cases.stages.stage_kwargs)."""
    kw = dict.fromkeys(stage_arguments(case))
    kw.update({n: tensors[n] for n in stage_input_names(case)})
    return {**kw, "cu_seqlens": cu_seqlens, **stage_kwargs(case)}


def stage_results(case: Case, returned) -> dict:
    """The case's outputs by name from what the stage function returned (FLA's order)."""
    names = stage_of(case.op, case.stage).outputs
    values = returned if len(names) > 1 else (returned,)
    if not isinstance(values, (tuple, list)) or len(values) != len(names):
        function = stage_of(case.op, case.stage).function
        raise ValueError(f"{function} returned {type(returned).__name__}, expected FLA's {len(names)} outputs {names}")
    got = dict(zip(names, values))
    return {n: got[n] for n in case.output_names() if got.get(n) is not None}


def run_stage_torch(
    fn: Callable,
    case: Case,
    inputs: dict[str, np.ndarray],
    device: str = "cpu",
    sync: Callable[[], None] = lambda: None,
) -> tuple[dict[str, np.ndarray], float]:
    """(outputs, seconds in fn) of a torch stage function on the case's stage inputs."""
    import torch

    tensors = {n: to_torch(inputs[n], device) for n in stage_input_names(case)}
    cu = inputs.get("cu_seqlens")
    cu = None if cu is None else torch.from_numpy(cu).to(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        returned = fn(**call_kwargs(case, tensors, cu))
    sync()
    seconds = time.perf_counter() - t0
    return defined_part(case, {n: from_torch(t) for n, t in stage_results(case, returned).items()}), seconds


def stage_program(fn: Callable, case: Case) -> Callable:
    """program(tensors) -> {output name: array}: the stage call in jax, cu_seqlens closed over as
    a concrete int32 array (kernels plan their layout on the host). The same program runs in
    interpret mode (`run_stage_jax`) and is compiled for TPU targets."""
    import jax.numpy as jnp

    cu = None if case.seqlens is None else jnp.asarray(case.cu_seqlens, jnp.int32)

    def program(tensors):
        return stage_results(case, fn(**call_kwargs(case, tensors, cu)))

    return program


def stage_structs(case: Case, sharding=None) -> dict:
    """The stage inputs as ShapeDtypeStructs (to trace or lower the program without inputs)."""
    import jax

    shapes = stage_shapes(case)
    return {
        n: jax.ShapeDtypeStruct(shapes[n], NP_DTYPES[stage_dtype(case, n)], sharding=sharding)
        for n in stage_input_names(case)
    }


def run_stage_jax(fn: Callable, case: Case, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """(outputs, seconds in fn) of a jax stage function on the case's stage inputs."""
    import jax
    import jax.numpy as jnp

    tensors = {n: jnp.asarray(inputs[n]) for n in stage_input_names(case)}
    program = stage_program(fn, case)
    t0 = time.perf_counter()
    out = jax.block_until_ready(program(tensors))
    seconds = time.perf_counter() - t0
    return defined_part(case, {n: np.asarray(a) for n, a in out.items()}), seconds


def case_program(case: Case, fn: Callable, sharding=None) -> tuple[Callable, tuple]:
    """(program, its arguments as ShapeDtypeStructs on `sharding`): an op case's (jax_program:
    (diff, cot)), or a stage case's (stage_calling.stage_program: (the stage inputs,))."""
    if case.stage is not None:
        return stage_program(fn, case), (stage_structs(case, sharding),)
    program, diff, cot = program_structs(case, fn, sharding)
    return program, (diff, cot)
