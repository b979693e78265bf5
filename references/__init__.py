"""The float64 oracle: one plain recurrence per op, gradients by autodiff (see common.py).

`oracle_run(case, inputs)` computes every tensor of `case.output_names()` in float64.
ORACLE_VERSION changes whenever the oracle's numerics change; results computed by
different oracle versions are never compared.
"""

from __future__ import annotations

import numpy as np

from . import gla, kda, simple_gla

ORACLE_VERSION = "1"
OPS = {"simple_gla": simple_gla, "gla": gla, "kda": kda}


def _op_kwargs(case, inputs: dict[str, np.ndarray]) -> dict:
    kw = {n: inputs[n] for n in ("q", "k", "v")}
    kw[case.gate_name] = inputs[case.gate_name]
    if case.op == "kda":
        kw["beta"] = inputs["beta"]
    kw["scale"] = case.scale_value
    kw["initial_state"] = inputs.get("initial_state")
    kw["cu_seqlens"] = inputs.get("cu_seqlens")
    return kw


def oracle_run(case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float64 numpy arrays for every name in case.output_names()."""
    mod = OPS[case.op]
    kw = _op_kwargs(case, inputs)
    if case.backward:
        out = mod.forward_backward(**kw, do=inputs["do"], dht=inputs.get("dht"))
    else:
        o, ht = mod.forward(**kw, output_final_state=True)
        out = {"o": o, "ht": ht}
    return {n: out[n] for n in case.output_names()}
