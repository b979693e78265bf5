"""Helpers shared by the stage tests (tests/test_stage_oracle*.py, tests/test_kernels_jax_stages*.py)."""

from __future__ import annotations

import numpy as np
import pytest

from cases import Case, make_inputs
from cases.inputs import STORAGE_DTYPES
from cases.stages import STAGE_ORDER, stage_dtype, stage_input_names, stage_shapes
from references import oracle_names, oracle_run
from references.stages import stage_inputs, stage_oracle
from references.stages.common import chunks


def rel(got, ref) -> float:
    """||got - ref|| / ||ref|| in float64 (Frobenius; ||got - ref|| for ref == 0)."""
    err = np.linalg.norm(np.asarray(got, np.float64) - ref)
    size = np.linalg.norm(ref)
    return float(err / size if size else err)


def stage_case(op_case: Case, stage: str) -> Case:
    """The stage case `stage` of the op case (direction "fwd", as stage ids have it)."""
    return op_case.replace(stage=stage, direction="fwd")


def reverse_local_cumsum(case, dg: np.ndarray) -> np.ndarray:
    """dg [B, T, heads, ...] -> the sum over s >= t within t's chunk (same shape): the gradient of
    the op's g from a stage's dg w.r.t. the chunk-local cumsum."""
    x = dg.reshape((-1,) + dg.shape[2:])
    out = np.empty_like(x)
    for _, s, e, _, _ in chunks(case):
        out[s:e] = np.flip(np.cumsum(np.flip(x[s:e], 0), 0), 0)
    return out.reshape(dg.shape)


def skip_on_cuda(torch) -> None:
    """Skips the test where a CUDA device is visible (it checks FLA's CPU interpreter path)."""
    if torch.cuda.is_available():
        pytest.skip("checks the CPU interpreter path; a CUDA device is visible")


def check_stage_inputs(c: Case, stage_inputs_f64, own: dict[str, str]) -> tuple[dict, dict]:
    """Asserts stage_inputs(c, x) on the op's inputs x: stage_input_names (plus cu_seqlens int64
    for varlen) in order, in the registry's shapes and dtypes, C-contiguous; each the op module's
    float64 value (stage_inputs_f64) rounded once, those named in `own` (stage input -> op input)
    the op's own bytes; a second call the same bytes; the oracle's outputs on them
    case.output_names() in the registry's shapes. Returns (the stage inputs, x)."""
    x = make_inputs(c.op_case)
    got = stage_inputs(c, x)
    names = stage_input_names(c) + (["cu_seqlens"] if c.seqlens is not None else [])
    assert list(got) == names
    shapes = stage_shapes(c)
    f64 = stage_inputs_f64(c, x)
    for n in stage_input_names(c):
        assert got[n].shape == shapes[n], (c.stage, n)
        assert got[n].dtype == STORAGE_DTYPES[stage_dtype(c, n)], (c.stage, n, got[n].dtype)
        assert got[n].flags.c_contiguous
        np.testing.assert_array_equal(got[n], f64[n].astype(got[n].dtype))
        if n in own:
            assert got[n].tobytes() == x[own[n]].tobytes(), (c.stage, n)
    if c.seqlens is not None:
        assert got["cu_seqlens"].dtype == np.int64
        assert got["cu_seqlens"].tolist() == list(c.cu_seqlens)
    again = stage_inputs(c, make_inputs(c.op_case))
    assert all(again[n].tobytes() == got[n].tobytes() for n in names)
    out = stage_oracle(c, got)
    assert list(out) == c.output_names()
    for n, a in out.items():
        assert a.shape == shapes[n], (c.stage, n)
    return got, x


def float64_stage_outputs(op_case: Case, x: dict, stage_inputs_f64, stages) -> dict[str, dict[str, np.ndarray]]:
    """stage -> the oracle's outputs (references.oracle_run) of that stage case of `op_case` on
    stage_inputs_f64(case, x) (the op module's float64 inputs before their cast), asserting
    they are case.output_names() (oracle_names), in float64."""
    out = {}
    for stage in stages:
        c = stage_case(op_case, stage)
        got = oracle_run(c, stage_inputs_f64(c, x))
        assert list(got) == c.output_names() == oracle_names(c)
        assert all(a.dtype == np.float64 for a in got.values())
        out[stage] = got
    return out


def fla_stage_runs(op_case: Case):
    """Yields (stage case, FLA's outputs in float64, the oracle's) for every stage of `op_case`:
    FLA's own stage function (parity's FlaBackend) and the float64 oracle on the same stage
    inputs; outputs by name, case.output_names()."""
    from parity.execute.backends.fla import FlaBackend

    x = make_inputs(op_case)
    for stage in STAGE_ORDER[op_case.op]:
        c = stage_case(op_case, stage)
        inputs = stage_inputs(c, x if c.op_case == op_case else make_inputs(c.op_case))
        got = FlaBackend().run(c, inputs).tensors
        yield c, {n: np.asarray(got[n], np.float64) for n in c.output_names()}, stage_oracle(c, inputs)
