"""The built-in candidates' kernels: which kernels_jax function `pallas` and `pallas-fused` call
for an op or an op's stage (cases.stages), and whether it has a kernel for a case's shapes
(checked before anything is traced)."""

from __future__ import annotations

import importlib

from cases import Case, storage_dtype
from cases.stages import stage_of
from parity.model.spec import Unsupported

# the built-in candidates: implementation name -> {op: (module, function)} of kernels_jax
PALLAS_KERNELS = {
    "pallas": {
        "simple_gla": ("kernels_jax.simple_gla", "chunk_simple_gla"),
        "gla": ("kernels_jax.gla", "chunk_gla"),
        "kda": ("kernels_jax.kda", "chunk_kda"),
        "gdn": ("kernels_jax.gdn", "chunk_gdn"),
        "gdn2": ("kernels_jax.gdn2", "chunk_gdn2"),
    },
    "pallas-fused": {"simple_gla": ("kernels_jax.simple_gla", "fused_chunk_simple_gla")},
}
FUSED_ONLY = {"pallas-fused": "the fused path exists for g_gamma gating only"}
# the implementation that runs kernels_jax's stage functions (each stage record's `kernels_jax`)
PALLAS_STAGES = "pallas"


# stages kernels_jax computes in XLA (jnp) inside its op's jit, not as Pallas kernels: their programs
# hold no Mosaic kernel, and none is asked of them
XLA_STAGES = frozenset({"local_cumsum"})


def claims_mosaic(case: Case) -> bool:
    """Whether kernels_jax's function for `case` is Pallas TPU kernels (its TPU module must hold a
    Mosaic kernel): every op, and every stage but the XLA ones (XLA_STAGES)."""
    return case.stage not in XLA_STAGES


def pallas_location(implementation: str, case: Case) -> tuple[str, str]:
    """(module, function) of the kernels_jax function `implementation` runs for `case` (the op's
    entry point, or the stage record's kernels_jax function); Unsupported where it has none."""
    if case.stage is not None:
        if implementation != PALLAS_STAGES:
            raise Unsupported(f"{implementation} has no stages of op {case.op!r}")
        module, _, function = stage_of(case.op, case.stage).kernels_jax.partition(":")
        return module, function
    where = PALLAS_KERNELS[implementation].get(case.op)
    if where is None:
        raise Unsupported(f"{implementation} has no kernel for op {case.op!r}")
    if implementation == "pallas-fused" and not case.uses_g_gamma:
        raise Unsupported(FUSED_ONLY[implementation])
    return where


def pallas_kernel(implementation: str, case: Case):
    """The kernels_jax function `implementation` ('pallas' or 'pallas-fused') runs for `case`;
    Unsupported (saying why) where it has none, checked before anything is traced."""
    where = pallas_location(implementation, case)
    # late: a kernels_jax module imports jax (heavy), only when a kernel is asked for; one that
    # fails to import is an error of the code under test, never `unsupported`
    from kernels_jax.common.validation import NoKernel

    module = importlib.import_module(where[0])
    package = importlib.import_module(f"kernels_jax.{case.op}")  # its check_supported: the op's shapes
    try:
        package.check_supported(case.K, case.V, storage_dtype(case, "q"))
    except NoKernel as e:
        raise Unsupported(str(e)) from None
    fn = getattr(module, where[1], None)
    if fn is None:
        raise Unsupported(f"{where[0]} has no {where[1]} (stage {case.kind})")
    return fn
