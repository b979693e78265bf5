"""Stages: the chunk stages FLA splits an op into, each judged on its own.

A stage case is an op case with `stage` set (id `simple_gla:fwd_h-fwd-B1-T128-...`): the op's
shapes, dtype, chunk, gate, scale, state and varlen parameters, and one of FLA's stage functions
in place of the whole op. Its inputs are what that function receives inside FLA's own op: the
op's inputs (cases.inputs) and the float64 oracle's upstream intermediates (chunk-local gate
cumsums, states, state gradients, ...), cast as FLA casts them (references.stages builds them,
the same bytes for every backend). Its outputs are the function's, under FLA's names.

One module per op with stages (cases/stages/<op>.py) declares them in FLA 0.6.0's calling
convention, which a stage candidate follows:
    STAGES                  its Stage declarations, in the order the op runs them
    tensors(case)           name -> Tensor(shape, layout) of every stage input and output (FLA's
                            layout; cases.layouts)
    dtype(case, name)       the dtype each is passed or returned in
    present(case, name)     whether an optional input or output is there for the case
    check(case)             raises ValueError naming what the op's stages do not take (optional)
    mask_undefined(case, name, value)
                            an output with the entries FLA's function leaves undefined (never
                            writes: torch.empty) set to 0, the same for every backend (optional)
Gates reach the stages as FLA 0.6.0's op passes them: after its chunk-local cumsum, in log2 units
(RCP_LN2 = 1 / ln 2; FLA's kernels take exp2).
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from types import ModuleType

from cases.layouts import Tensor

RCP_LN2 = 1.4426950408889634  # 1 / ln 2: FLA's gates reach its kernels in log2 units
# ops with stage cases, in cases.case.OPS order: those with a module here, cases/stages/<op>.py
STAGE_OPS = tuple(
    op for op in ("simple_gla", "gla", "kda", "gdn", "gdn2") if (Path(__file__).parent / f"{op}.py").exists()
)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One of FLA's stage functions, as the registry knows it.

    inputs: its tensor arguments, in FLA's order ("gate": the case's g or g_gamma); outputs: the
    names of what it returns, in its order (a tuple when more than one; absent ones per the op
    module's `present`); kwargs: its other arguments as FLA's op passes them, (name, value)
    pairs, a value "$scale" standing for the case's scale and "$ht" for whether it returns a
    final state; cu_seqlens is always passed, chunk_size where FLA's function takes it
    (takes_chunk_size)."""

    op: str
    name: str
    fla: str  # "module:function"
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    direction: str  # "fwd" or "bwd": the half of the op it belongs to
    kwargs: tuple[tuple[str, object], ...] = ()
    g_only: bool = False  # only for per-token g gates (no g_gamma)
    takes_chunk_size: bool = True  # False: FLA's function reads the chunk size from a tensor's shape

    @property
    def function(self) -> str:
        """The name of FLA's function: "chunk_fwd_h" (a stage candidate's function has it too)."""
        return self.fla.rpartition(":")[2]

    @property
    def kind(self) -> str:
        """The op token of its cases' ids: "simple_gla:fwd_h"."""
        return f"{self.op}:{self.name}"


def num_chunks(case) -> int:
    """NT of FLA's per-chunk tensors [B, NT, ...]: chunks per row, or over all packed sequences."""
    C = case.chunk_size
    if case.seqlens is not None:
        return sum(-(-n // C) for n in case.seqlens)
    return -(-case.T // C)


def op_module(op: str) -> ModuleType:
    """cases/stages/<op>.py; KeyError naming the ops with stages otherwise."""
    if op not in STAGE_OPS:
        raise KeyError(f"op {op!r} has no stage cases: ops with stages are {list(STAGE_OPS)}")
    return importlib.import_module(f"cases.stages.{op}")


STAGES: dict[str, dict[str, Stage]] = {op: {s.name: s for s in op_module(op).STAGES} for op in STAGE_OPS}
# the order an op's stages run in (its forward, then its backward): the first over its bound is
# where a failing op went wrong (parity localise)
STAGE_ORDER: dict[str, tuple[str, ...]] = {op: tuple(stages) for op, stages in STAGES.items()}
STAGE_FUNCTIONS = frozenset(s.function for stages in STAGES.values() for s in stages.values())


def stage_of(op: str, name: str) -> Stage:
    """The stage `name` of `op`; KeyError naming the allowed ones otherwise."""
    try:
        return STAGES[op][name]
    except KeyError:
        allowed = list(STAGES.get(op, {}))
        raise KeyError(f"op {op!r} has no stage {name!r}: its stages are {allowed}") from None


def check_stage(case) -> None:
    """ValueError naming what the case's op's stages do not take (its module's `check`)."""
    check = getattr(op_module(case.op), "check", None)
    if check is not None:
        check(case)


def stage_outputs(case) -> list[str]:
    """The tensors a stage case's function returns that are judged, in FLA's order."""
    present = op_module(case.op).present
    return [n for n in stage_of(case.op, case.stage).outputs if present(case, n)]


def stage_arguments(case) -> list[str]:
    """Every tensor argument of the stage function, in FLA's order, under FLA's names (the gate as
    the case's g or g_gamma), whether or not the case has it."""
    return [case.gate_name if n == "gate" else n for n in stage_of(case.op, case.stage).inputs]


def stage_input_names(case) -> list[str]:
    """The stage function's tensor inputs for `case` (stage_arguments), those the case has (`present`)."""
    present = op_module(case.op).present
    return [n for n in stage_arguments(case) if present(case, n)]


def stage_kwargs(case) -> dict[str, object]:
    """The stage function's other arguments for `case`: chunk_size where it takes one, and
    Stage.kwargs ("$scale" and "$ht" filled in)."""
    stage = stage_of(case.op, case.stage)
    values = {"$scale": case.scale_value, "$ht": case.ht}
    kw = {"chunk_size": case.chunk_size} if stage.takes_chunk_size else {}
    return {**kw, **{k: values.get(v, v) if isinstance(v, str) else v for k, v in stage.kwargs}}


def defined_part(case, outputs: dict) -> dict:
    """Stage outputs (numpy, by name) with what FLA's function leaves undefined set to 0 (the op
    module's `mask_undefined`): every backend's outputs are compared on what FLA defines."""
    mask = getattr(op_module(case.op), "mask_undefined", None)
    return outputs if mask is None else {n: mask(case, n, a) for n, a in outputs.items()}


def stage_tensors(case) -> dict[str, Tensor]:
    """Shape and layout of every stage input and output of `case` (FLA's layout)."""
    return op_module(case.op).tensors(case)


def stage_shapes(case) -> dict[str, tuple[int, ...]]:
    """Shape of every stage input and output of `case` (FLA's layout)."""
    return {name: t.shape for name, t in stage_tensors(case).items()}


def stage_dtype(case, name: str) -> str:
    """The dtype stage tensor `name` (input or output) is passed or returned in."""
    return op_module(case.op).dtype(case, name)
