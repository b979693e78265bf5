"""`case_inputs(case)`: the inputs every backend of a case receives, the same bytes for each.

An op case's are cases.inputs.make_inputs's. A stage case's (cases.stages) are what FLA's stage
function receives inside the op: the op case's inputs and the float64 oracle's upstream
intermediates (chunk-local gate cumsums, states, state gradients), cast as FLA casts them
(references.stages.stage_inputs).
"""

from __future__ import annotations

import numpy as np

from cases import Case, make_inputs


def case_inputs(case: Case) -> dict[str, np.ndarray]:
    """The case's inputs by name (numpy; cu_seqlens int64 for a varlen case)."""
    if case.stage is None:
        return make_inputs(case)
    # late: the oracle imports jax (heavy)
    from references.stages import stage_inputs

    return stage_inputs(case, make_inputs(case.op_case))
