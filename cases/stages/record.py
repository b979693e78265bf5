"""The records of the stage registry (cases.stages): one `Stage` per stage of FLA's, one `StageOp`
per op with stages (what its stages share), and the values they are declared with."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

from cases.layouts import Tensor

RCP_LN2 = 1.4426950408889634  # 1 / ln 2: FLA's gates reach its kernels in log2 units


@dataclasses.dataclass(frozen=True)
class FromCase:
    """A keyword argument whose value is the case's attribute `attr` (case.scale_value, ...);
    `words`: how docs/stages.md's table writes it."""

    attr: str
    words: str

    def value(self, case) -> object:
        return getattr(case, self.attr)


CASE_SCALE = FromCase("scale_value", "<the case's scale>")
RETURNS_FINAL_STATE = FromCase("ht", "<whether the case returns a final state>")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One of FLA's stage functions, declared whole.

    fla, oracle, kernels_jax: "module:function" of FLA's function, of its float64 oracle
    (references.stages.<op>: oracle(case, inputs) -> outputs, numpy float64 by name) and of
    kernels_jax's port (FLA's name and calling convention), resolved where they are called
    (`resolve`: cases imports neither references nor kernels_jax). inputs: its tensor arguments,
    in FLA's order ("gate": the case's g or g_gamma); outputs: the names of what it returns, in its
    order (a tuple when more than one); each tensor's shape, layout and dtype are its op's
    (`StageOp.tensors`, `StageOp.dtype`; absent ones per `StageOp.present`), but for those of
    `like` (argument, the op's tensor FLA passes as it: kda's fwd_h takes kg as k), which are that
    tensor's, and those of `case_dtype`, passed or returned in the case dtype where the op keeps
    the name in float32 (FLA's forward keeps the states h in k's dtype). kwargs: its other
    arguments as FLA's op passes them, (name, value) pairs, a value a FromCase (the case's scale,
    whether it returns a final state) or a constant; cu_seqlens is always passed, chunk_size
    where FLA's function takes it (takes_chunk_size)."""

    op: str
    name: str
    fla: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    direction: str  # "fwd" or "bwd": the half of the op it belongs to
    oracle: str
    kernels_jax: str
    kwargs: tuple[tuple[str, object], ...] = ()
    g_only: bool = False  # only for per-token g gates (no g_gamma)
    takes_chunk_size: bool = True  # False: FLA's function reads the chunk size from a tensor's shape
    like: tuple[tuple[str, str], ...] = ()
    case_dtype: tuple[str, ...] = ()

    @property
    def function(self) -> str:
        """The name of FLA's function: "chunk_fwd_h" (a stage candidate's function has it too)."""
        return self.fla.rpartition(":")[2]

    @property
    def kind(self) -> str:
        """The op token of its cases' ids: "simple_gla:fwd_h"."""
        return f"{self.op}:{self.name}"

    def call_kwargs(self, case) -> dict[str, object]:
        """Its other arguments for `case`: chunk_size where it takes one, and `kwargs` (each
        FromCase's value the case's)."""
        kw = {"chunk_size": case.chunk_size} if self.takes_chunk_size else {}
        return {**kw, **{k: v.value(case) if isinstance(v, FromCase) else v for k, v in self.kwargs}}


def _always_defined(case, name: str, value):
    return value


def _takes_every_case(case) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class StageOp:
    """What the stages of one op share (cases/stages/<op>.py).

    stages: its Stage records, in the order the op runs them; tensors(case): name -> Tensor(shape,
    layout) of every stage input and output (FLA's layout, cases.layouts); dtype(case, name): the
    dtype each is passed or returned in; present(case, name): whether an optional input or output
    is there for the case; check(case): raises ValueError naming what the op's stages do not take;
    mask_undefined(case, name, value): an output with the entries FLA's function leaves undefined
    (torch.empty, never written) set to 0, the same for every backend; inputs: "module:function"
    of the builder of a stage case's inputs from the op's (references.stages.<op>:
    stage_inputs(case, op_inputs) -> inputs in their stage dtypes)."""

    op: str
    stages: tuple[Stage, ...]
    tensors: Callable[..., dict[str, Tensor]]
    dtype: Callable[..., str]
    present: Callable[..., bool]
    inputs: str
    check: Callable[..., None] = _takes_every_case
    mask_undefined: Callable = _always_defined


def local_cumsum_stage(op: str) -> Stage:
    """FLA's chunk_local_cumsum of `op`'s per-token g gate [B, T, H, ...] -> g_cumsum (the same
    shape, times 1 / ln 2: log2 units), the first stage of every op with a g gate."""
    return Stage(
        op,
        "local_cumsum",
        "fla.ops.utils.cumsum:chunk_local_cumsum",
        ("g",),
        ("g_cumsum",),
        "fwd",
        oracle="references.stages.common:oracle_local_cumsum",
        kernels_jax=f"kernels_jax.{op}.stages:chunk_local_cumsum",
        kwargs=(("scale", RCP_LN2),),
        g_only=True,
    )


def num_chunks(case) -> int:
    """NT of FLA's per-chunk tensors [B, NT, ...]: chunks per row, or over all packed sequences."""
    C = case.chunk_size
    if case.seqlens is not None:
        return sum(-(-n // C) for n in case.seqlens)
    return -(-case.T // C)


def resolve(where: str) -> Callable:
    """The function "module:function" names (a Stage's oracle, kernels_jax or fla, a StageOp's
    inputs), its module imported on first use."""
    module, _, function = where.partition(":")
    return getattr(importlib.import_module(module), function)
