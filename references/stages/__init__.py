"""Float64 oracles of the ops' chunk stages (cases.stages), and the stage inputs.

A stage case (case.stage set) is one of FLA's chunk stage functions of an op, judged alone:
`stage_inputs(case, op_inputs)` builds its inputs from the op's (cases.make_inputs(case.op_case))
with its op's builder (StageOp.inputs), `stage_oracle(case, inputs)` computes its outputs
(case.output_names()) in float64 from them with its record's oracle (Stage.oracle). One module
per op with stages: references/stages/<op>.py, one oracle function per stage,
oracle_<stage>(case, float64 inputs by name) -> float64 outputs by name.
"""

from __future__ import annotations

import numpy as np

from cases.stages import resolve, stage_of, stage_op
from references.stages.common import float64_tensors

__all__ = ["stage_inputs", "stage_oracle"]


def stage_inputs(case, op_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage case's inputs under FLA's names (plus cu_seqlens int64 for varlen), each in its
    stage dtype, from the op's stored inputs."""
    return resolve(stage_op(case.op).inputs)(case, op_inputs)


def stage_oracle(case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float64 outputs (case.output_names()) of the stage case on its stage inputs (any float
    dtype: upcast to float64)."""
    out = resolve(stage_of(case.op, case.stage).oracle)(case, float64_tensors(inputs))
    return {n: out[n] for n in case.output_names()}
