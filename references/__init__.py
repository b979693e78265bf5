"""The float64 oracle: one plain recurrence per op, the definition (gradients by autodiff,
references/common.py), computed by default in an equivalent chunked form with a hand-written
backward (references/chunked.py), held to the recurrence at 1e-12 relative by the tests.

`oracle_run(case, inputs)` computes every tensor of `case.output_names()` in float64, and for
a gradient that is a sum over tokens (dg_gamma [H]) its per-token terms (`TERMS`), from which
`error_scales` gives the size its error is measured against.
ORACLE_VERSION changes whenever the oracle's numerics change; results computed by
different oracle versions are never compared.
"""

from __future__ import annotations

import importlib

import numpy as np

from references.stages import stage_oracle
from references.version import ORACLE_VERSION

__all__ = ["ORACLE_VERSION", "OPS", "TERMS", "error_scales", "oracle_names", "oracle_run"]
OPS = ("simple_gla", "gla", "kda", "gdn", "gdn2")  # one module each: references/<op>.py


def _op_kwargs(case, inputs: dict[str, np.ndarray]) -> dict:
    kw = {n: inputs[n] for n in ("q", "k", "v")}
    kw[case.gate_name] = inputs[case.gate_name]
    for name in case.delta_gates:  # beta (kda, gdn), or b and w (gdn2)
        kw[name] = inputs[name]
    kw["scale"] = case.scale_value
    kw["initial_state"] = inputs.get("initial_state")
    kw["cu_seqlens"] = inputs.get("cu_seqlens")
    return kw


# gradient -> its per-token terms [B, T, H]: dg_gamma[h] = sum over b, t of dg_gamma_terms[b, t, h]
TERMS = {"dg_gamma": "dg_gamma_terms"}


def oracle_names(case) -> list[str]:
    """What oracle_run returns: case.output_names() and the TERMS of those (a stage case:
    case.output_names() alone)."""
    names = case.output_names()
    if case.stage is not None:
        return names
    return names + [TERMS[n] for n in names if n in TERMS]


def error_scales(out: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """Tensor -> the size each of its elements' error is measured against (parity.measure.compare), for the
    tensors where that is not the tensor's rms: a sum over tokens (dg_gamma [H]) is measured per
    head against max(|sum|, sqrt(sum of squared terms)). Terms with independent relative errors e
    give the sum an error of about e times the latter, which can be far above the sum itself
    (simple_gla-fwdbwd-B2-T64-H1-K64-V64-fp32-C64-gamma_retnet-s1.0-h0-ht: dg_gamma = 39.6 from
    terms of rms 694, sqrt of squares 7857), and each head counts alike, whatever its magnitude."""
    scales = {}
    for name, terms in TERMS.items():
        if name in out and terms in out:
            size = np.sqrt(np.sum(np.square(out[terms]), axis=(0, 1)))
            scales[name] = np.maximum(np.abs(out[name]), size).tolist()
    return scales


def oracle_run(case, inputs: dict[str, np.ndarray], method: str = "chunked") -> dict[str, np.ndarray]:
    """float64 numpy arrays for every name in oracle_names(case); method "chunked" (the
    default, fast) or "recurrence" (the definition, references.common.run_recurrence).
    A stage case (case.stage set) takes its stage inputs (references.stages.stage_inputs) and
    runs references.stages.stage_oracle (one float64 form: method does not apply)."""
    if case.stage is not None:
        return stage_oracle(case, inputs)
    # late: the per-op oracles import jax (heavy); the package's names and version stay light
    mod = importlib.import_module(f"references.{case.op}")
    kw = _op_kwargs(case, inputs)
    if case.backward:
        out = mod.forward_backward(**kw, do=inputs["do"], dht=inputs.get("dht"), method=method)
    else:
        o, ht = mod.forward(**kw, output_final_state=True, method=method)
        out = {"o": o, "ht": ht}
    return {n: out[n] for n in oracle_names(case)}
