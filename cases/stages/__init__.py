"""Stages: the chunk stages FLA splits an op into, each judged on its own.

A stage case is an op case with `stage` set (id `simple_gla:fwd_h-fwd-B1-T128-...`): the op's
shapes, dtype, chunk, gate, scale, state and varlen parameters, and one of FLA's stage functions
in place of the whole op. Its inputs are what that function receives inside FLA's own op: the
op's inputs (cases.inputs) and the float64 oracle's upstream intermediates (chunk-local gate
cumsums, states, state gradients, ...), cast as FLA casts them (references.stages builds them,
the same bytes for every backend). Its outputs are the function's, under FLA's names.

The registry, in FLA 0.6.0's calling convention, which a stage candidate follows: one `Stage`
record per stage (cases.stages.record), declaring together its FLA function, tensor inputs and
outputs, other keyword arguments, whether it takes chunk_size, whether it is for g gates only,
its float64 oracle and kernels_jax's function; one `StageOp` per op with stages
(cases/stages/<op>.py: STAGE_OP), holding its records in the order the op runs them and what
they share: the shape, layout and dtype of each tensor name, which optional ones a case has, what
the op's stages refuse, what FLA leaves undefined, and the builder of the stage inputs. Adding a
stage is adding its record to its op's STAGE_OP, with its oracle (references/stages/<op>.py) and
kernels_jax function (kernels_jax/<op>/stages.py).
Gates reach the stages as FLA 0.6.0's op passes them: after its chunk-local cumsum, in log2 units
(RCP_LN2 = 1 / ln 2; FLA's kernels take exp2).
"""

from __future__ import annotations

from cases.layouts import Tensor
from cases.stages import gdn, gla, kda, simple_gla
from cases.stages.record import RCP_LN2 as RCP_LN2
from cases.stages.record import Stage, StageOp
from cases.stages.record import num_chunks as num_chunks
from cases.stages.record import resolve as resolve

# the ops with stage cases, in cases.case.OPS order
STAGE_OP: dict[str, StageOp] = {m.STAGE_OP.op: m.STAGE_OP for m in (simple_gla, gla, kda, gdn)}
STAGE_OPS = tuple(STAGE_OP)
STAGES: dict[str, dict[str, Stage]] = {op: {s.name: s for s in o.stages} for op, o in STAGE_OP.items()}
# the order an op's stages run in (its forward, then its backward): the first over its bound is
# where a failing op went wrong (parity localise)
STAGE_ORDER: dict[str, tuple[str, ...]] = {op: tuple(stages) for op, stages in STAGES.items()}
STAGE_FUNCTIONS = frozenset(s.function for stages in STAGES.values() for s in stages.values())


def stage_op(op: str) -> StageOp:
    """What the stages of `op` share (cases/stages/<op>.py); KeyError naming the ops with stages otherwise."""
    if op not in STAGE_OP:
        raise KeyError(f"op {op!r} has no stage cases: ops with stages are {list(STAGE_OPS)}")
    return STAGE_OP[op]


def stage_of(op: str, name: str) -> Stage:
    """The stage `name` of `op`; KeyError naming the allowed ones otherwise."""
    try:
        return STAGES[op][name]
    except KeyError:
        allowed = list(STAGES.get(op, {}))
        raise KeyError(f"op {op!r} has no stage {name!r}: its stages are {allowed}") from None


def check_stage(case) -> None:
    """ValueError naming what the case's op's stages do not take (StageOp.check)."""
    stage_op(case.op).check(case)


def stage_outputs(case) -> list[str]:
    """The tensors a stage case's function returns that are judged, in FLA's order."""
    present = stage_op(case.op).present
    return [n for n in stage_of(case.op, case.stage).outputs if present(case, n)]


def stage_arguments(case) -> list[str]:
    """Every tensor argument of the stage function, in FLA's order, under FLA's names (the gate as
    the case's g or g_gamma), whether or not the case has it."""
    return [case.gate_name if n == "gate" else n for n in stage_of(case.op, case.stage).inputs]


def stage_input_names(case) -> list[str]:
    """The stage function's tensor inputs for `case` (stage_arguments), those the case has (`present`)."""
    present = stage_op(case.op).present
    return [n for n in stage_arguments(case) if present(case, n)]


def stage_kwargs(case) -> dict[str, object]:
    """The stage function's other arguments for `case` (Stage.call_kwargs): chunk_size where it
    takes one, scale, output_final_state, ..."""
    return stage_of(case.op, case.stage).call_kwargs(case)


def defined_part(case, outputs: dict) -> dict:
    """Stage outputs (numpy, by name) with what FLA's function leaves undefined set to 0
    (StageOp.mask_undefined): every backend's outputs are compared on what FLA defines."""
    mask = stage_op(case.op).mask_undefined
    return {n: mask(case, n, a) for n, a in outputs.items()}


def stage_tensors(case) -> dict[str, Tensor]:
    """Shape and layout of every stage input and output of `case` (FLA's layout): its op's
    (StageOp.tensors), those its stage takes like another tensor (Stage.like) that one's."""
    tensors = stage_op(case.op).tensors(case)
    return {**tensors, **{name: tensors[source] for name, source in stage_of(case.op, case.stage).like}}


def stage_shapes(case) -> dict[str, tuple[int, ...]]:
    """Shape of every stage input and output of `case` (FLA's layout)."""
    return {name: t.shape for name, t in stage_tensors(case).items()}


def stage_dtype(case, name: str) -> str:
    """The dtype stage tensor `name` (input or output) is passed or returned in: the case dtype
    where its stage says so (Stage.case_dtype), else its op's (StageOp.dtype) of the tensor it
    is (Stage.like)."""
    stage = stage_of(case.op, case.stage)
    if name in stage.case_dtype:
        return case.dtype
    return stage_op(case.op).dtype(case, dict(stage.like).get(name, name))
