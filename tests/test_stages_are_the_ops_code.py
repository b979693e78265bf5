"""A stage case judges the op's own code: for every op with stages (cases.stages.STAGE_ORDER), the
Pallas kernels that each stage's kernels_jax function runs are kernels the op's forward and
backward run. Both sides are read from the programs the harness runs (parity.model.kernels and
the calling code: the op's program with h0, ht and the backward, each stage's program), traced
with jax.make_jaxpr, every pallas_call collected by name through the nested jaxprs (jit, custom_vjp,
the backward's transposition)."""

from __future__ import annotations

import jax
import pytest
from jax.extend import core as jcore

from cases import Case
from cases.stages import STAGE_ORDER
from parity.execute.backends.stage_calling import case_program
from parity.model.kernels import PALLAS_STAGES, XLA_STAGES, pallas_kernel

OP_CASE = "{op}-fwdbwd-B1-T64-H2-K32-V32-fp32-C32-g_logsig-h0-ht"


def pallas_calls(case: Case) -> set[str]:
    """The names of the pallas_calls in the program the harness runs for `case` (kernels_jax's)."""
    program, args = case_program(case, pallas_kernel(PALLAS_STAGES, case))
    names: set[str] = set()

    def walk(jaxpr) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                names.add(eqn.params["name"])
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(sub, jcore.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jcore.Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(program)(*args).jaxpr)
    return names


@pytest.mark.parametrize("op", list(STAGE_ORDER))
def test_every_stage_kernel_is_one_its_op_runs(op):
    case = Case.from_id(OP_CASE.format(op=op))
    op_kernels = pallas_calls(case)
    assert op_kernels, "the op's program holds no Pallas kernel"
    found = {}
    for stage in STAGE_ORDER[op]:
        if stage in XLA_STAGES:  # a jnp stage: no kernel to compare (parity.model.kernels)
            continue
        found[stage] = pallas_calls(case.replace(stage=stage, direction="fwd"))
        assert found[stage], f"stage {stage} runs no Pallas kernel"
    not_run = {stage: sorted(names - op_kernels) for stage, names in found.items() if names - op_kernels}
    assert not not_run, f"stage kernels {op} does not run: {not_run} (the op runs {sorted(op_kernels)})"
    unjudged = op_kernels - set().union(*found.values())
    assert not unjudged, f"kernels of {op} no stage case runs: {sorted(unjudged)}"
