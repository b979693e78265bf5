"""`tol(case, tensor)`: the rel_rms against the float64 oracle that a correct kernel meets, and
`tolerance_verdict`: a tensor's verdict against it.

Formula (one for the whole project):

    tol = max(coef[op][tensor][dtype] * u(dtype) * growth(case), roundoff(dtype the tensor is returned in))
    growth = sqrt(max(K, 64) / 64) * sqrt(max(chunk_size, 64) / 64) * (1 + 0.5 * log2(max(1, T / chunk_size)))

u(dtype) is the unit roundoff of the precision the reference really computes in, stated in
tolerances.json ("unit"): float32 2^-11 (a GPU's float32 matmuls run on tensor cores in TF32, 10
explicit mantissa bits), bfloat16 2^-8, float16 2^-11; so a coefficient reads as "so many
roundoffs of the arithmetic FLA used". Every op, tensor and dtype has its own entry (no dtype
falls back to another's; a missing entry is a KeyError naming it). The sqrt(K) factor is the
length of the q.k reductions; sqrt(chunk) the length of the intra-chunk reductions; the log
term the slow growth of error through the chunk-to-chunk state recurrence (rel_rms is
normalised, so it does not grow linearly with T). Below 64 a smaller K or chunk does not make
the error smaller (fewer terms, but the same rounding per term and the same gates), so both
factors stop at 64. Fitted from FLA in the Triton interpreter at K and V from 8, chunk 16 and 32,
T from 1 (180 cases, fwd+bwd with h0 and ht, both dtypes, three ops; benchmarks/small_dims.py):
with sqrt(K / 64) * sqrt(chunk / 64) all the way down, FLA fails its own tolerance by up to 3.9x
(kda dh0 at K = V = 8, C = 16, T = 17); with the floor at 64 for both its worst is 0.69 of the
tolerance on the fitting sweep and 0.46 on a second one (other seeds and shapes); a floor at 32
for either leaves it at 0.97. `tensor` groups: o, ht, dq, dk, dv, dg,
dbeta (gdn2: db, dw), dh0 each have their own coefficient, because gradients accumulate differently (dg is a
sum with cancellation and carries the largest relative error).

dg_gamma [H] has no coefficient of its own: no reference computes it (FLA returns none), and it is
the sum over tokens of the per-token gate gradient, dg_gamma[h] = sum_{b,t} dg[b, t, h]. It has
dg's coefficient, and its error is measured per head against the size of what it sums
(parity.measure.compare, references.error_scales). On simple_gla-fwdbwd-B2-T64-H1-K64-V64-fp32-
C64-gamma_retnet-s1.0-h0-ht, terms of rms 694 cancel to dg_gamma = 39.6; the fused and chunked
float32 kernels are off by 1.1e-4 and 5.7e-4 of it (2.9e-6 of what they sum): a coefficient of
0.5 u relative to the sum itself would fail the chunked one.

`parity calibrate DIR` fits coef from the reference-side (FLA) epsilons of a run:
coef = MARGIN * max(eps / (u(dtype) * growth)) over that run's cases, per op, tensor and dtype,
keeps the current coefficient where the run has no sample, and writes tolerances.json with a
new version. Every verdict records TOL_VERSION. A stage (cases.stages) has coefficients of its own,
under its kind ("simple_gla:fwd_h"), per stage tensor (h, g_cumsum, dh, ...), fitted the same way
from FLA's stage functions.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np

from cases.stages import stage_dtype
from parity.model.verdict import Verdict

TOL_FILE = Path(__file__).with_name("tolerances.json")
MARGIN = 4.0
NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
# tensors computed from float32-only inputs (gates, states) are float32 whatever the case dtype
FP32_OUTPUTS = ("ht", "dh0", "dg", "dg_gamma", "dbeta", "db")  # dw: w is in the case dtype


def _load() -> dict:
    return json.loads(TOL_FILE.read_text())


_TABLE = _load()
TOL_VERSION: str = _TABLE["version"]
UNIT: dict[str, float] = _TABLE["unit"]  # dtype -> unit roundoff of the reference's arithmetic
# dtype -> unit roundoff of the dtype itself: the floor of any tolerance on a tensor returned in it
ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


SMALL_DIMS_FLOOR = 64  # K and chunk below it count as it (module docstring)


def growth(case) -> float:
    return (
        math.sqrt(max(case.K, SMALL_DIMS_FLOOR) / 64)
        * math.sqrt(max(case.chunk_size, SMALL_DIMS_FLOOR) / 64)
        * (1 + 0.5 * math.log2(max(1.0, case.T / case.chunk_size)))
    )


# tensors whose tolerance is another's carried through a sum (module docstring)
COEF_OF = {"dg_gamma": "dg"}


def coef(case, tensor: str, table: dict | None = None) -> float:
    """The coefficient of (case.kind: the op, or the op's stage "simple_gla:fwd_h"; tensor; dtype)."""
    table = table or _TABLE
    try:
        return table["coef"][case.kind][COEF_OF.get(tensor, tensor)][case.dtype]
    except KeyError:
        raise KeyError(
            f"tolerances.json has no coefficient for {case.kind!r}, tensor {tensor!r}, dtype {case.dtype!r}"
        ) from None


def tol(case, tensor: str) -> float:
    """Largest rel_rms against the oracle that a correct implementation of `case` shows on `tensor`:
    the formula, and never below the unit roundoff of the dtype the tensor is returned in (the oracle
    itself rounded to bfloat16 has rel_rms up to about u / 2; the formula falls under it at small K
    and chunk, e.g. simple_gla-fwd-B1-T16-H1-K8-V8-bf16-C16-g_logsig)."""
    return max(coef(case, tensor) * UNIT[case.dtype] * growth(case), ROUNDOFF[output_dtype(case, tensor)])


def tolerance_verdict(nan: int, inf: int, eps: float, tolerance: float) -> Verdict:
    """A tensor's verdict against its tolerance: nan-inf (NaN/Inf where the oracle is finite), else
    fail-accuracy (rel_rms `eps` over `tolerance`, or NaN), else pass. Each record's tensors hold it
    from the run on (parity.measure.compare), below the gate's bound (parity.judge.bound)."""
    if nan or inf:
        return Verdict.NAN_INF
    return Verdict.FAIL_ACCURACY if not eps <= tolerance else Verdict.PASS


def output_dtype(case, tensor: str) -> str:
    """The dtype a kernel returns `tensor` in: float32 for state/gate tensors, else the case dtype;
    a stage's tensors as FLA's stage function returns them (cases.stages.stage_dtype)."""
    if getattr(case, "stage", None) is not None:
        return stage_dtype(case, tensor)
    return "float32" if tensor in FP32_OUTPUTS else case.dtype


def calibrate(samples: list[tuple[object, str, float]], table: dict | None = None) -> dict:
    """New tolerance table from (case, tensor, reference rel_rms) samples."""
    table = json.loads(json.dumps(table or _TABLE))
    fitted: dict[tuple[str, str, str], float] = {}
    for case, tensor, eps in samples:
        if eps is None or not math.isfinite(eps) or tensor in COEF_OF:
            continue
        key = (case.kind, tensor, case.dtype)
        ratio = eps / (table["unit"][case.dtype] * growth(case))
        fitted[key] = max(fitted.get(key, 0.0), ratio)
    for (op, tensor, dtype), ratio in fitted.items():
        table["coef"].setdefault(op, {}).setdefault(tensor, {})[dtype] = float(f"{MARGIN * ratio:.5g}")
    major = int(str(table["version"]).split(".")[0])
    table["version"] = f"{major + 1}"
    table["fitted_from"] = len(samples)
    table["note"] = f"fitted by parity calibrate: coef = {MARGIN} x the largest reference eps / (u * growth)"
    return table
