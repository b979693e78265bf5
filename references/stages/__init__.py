"""Float64 oracles of the ops' chunk stages (cases.stages), and the stage inputs.

A stage case (case.stage set) is one of FLA's chunk stage functions of an op, judged alone:
`stage_inputs(case, op_inputs)` builds its inputs from the op's (cases.make_inputs(case.op_case)),
`stage_oracle(case, inputs)` computes its outputs (case.output_names()) in float64 from them.
One module per op with stages: references/stages/<op>.py.
"""

from __future__ import annotations

import importlib

import numpy as np

from cases.stages import STAGE_OPS

__all__ = ["stage_inputs", "stage_oracle"]


def _module(case):
    if case.op not in STAGE_OPS:
        raise ValueError(f"op {case.op!r} has no stage oracle: ops with stages are {list(STAGE_OPS)}")
    return importlib.import_module(f"references.stages.{case.op}")


def stage_inputs(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage case's inputs under FLA's names (plus cu_seqlens int64 for varlen), each in its
    stage dtype, from the op's stored inputs."""
    return _module(case).stage_inputs(case, op_inputs)


def stage_oracle(case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float64 outputs (case.output_names()) of the stage case on its stage inputs."""
    return _module(case).stage_oracle(case, inputs)
