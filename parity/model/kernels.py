"""The built-in candidates' kernels: which kernels_jax function `pallas` and `pallas-fused` call
for an op, and whether it has a kernel for a case's shapes (checked before anything is traced)."""

from __future__ import annotations

import importlib

from cases import Case, storage_dtype
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


def pallas_kernel(implementation: str, case: Case):
    """The kernels_jax function `implementation` ('pallas' or 'pallas-fused') runs for `case`;
    Unsupported (saying why) where it has none, checked before anything is traced."""
    where = PALLAS_KERNELS[implementation].get(case.op)
    if where is None:
        raise Unsupported(f"{implementation} has no kernel for op {case.op!r}")
    if implementation == "pallas-fused" and not case.uses_g_gamma:
        raise Unsupported(FUSED_ONLY[implementation])
    # late: a kernels_jax module imports jax (heavy), only when a kernel is asked for; one that
    # fails to import is an error of the code under test, never `unsupported`
    from kernels_jax.common.validation import NoKernel

    module = importlib.import_module(where[0])
    try:
        module.check_supported(case.K, case.V, storage_dtype(case, "q"))
    except NoKernel as e:
        raise Unsupported(str(e)) from None
    return getattr(module, where[1])
