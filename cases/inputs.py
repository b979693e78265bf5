"""Deterministic inputs from a case alone.

Every tensor comes from its own counter-based stream (numpy Philox keyed by
sha256(seed, tensor name)), is drawn in float64 and then rounded once to its
storage dtype (ml_dtypes for bfloat16). Torch and jax receive these exact bits;
nothing here depends on the installed torch or jax.

Tensors (FLA names and layout; HV = case.value_heads, H except for grouped kda / gdn / gdn2 cases):
    q, k        [B, T, H, K]    case dtype (kda, gdn, gdn2: L2-normalised over K before rounding)
    v           [B, T, HV, V]   case dtype
    g           [B, T, H]       float32 log-decay (simple_gla), [B, T, HV] (gdn), or
                [B, T, H, K] (gla), [B, T, HV, K] (kda, gdn2)
    g_gamma     [H]             float32 per-head log-decay (simple_gla, gamma_* gates)
    beta        [B, T, HV]      float32 in (0, 1) (kda, gdn)
    b           [B, T, HV, K]   float32 in (0, 1) (gdn2: erase gate; drawn as beta, own stream)
    w           [B, T, HV, V]   case dtype, in (0, 1) (gdn2: write gate; drawn as beta, own stream;
                                in v's dtype as FLA's chunk_gdn2 needs it: its backward's dot takes w * v)
    initial_state [N, HV, K, V] float32 (when case.h0)
    cu_seqlens  [N + 1]         int64 (varlen cases)
    do          [B, T, HV, V]   case dtype (fwdbwd)
    dht         [N, HV, K, V]   float32 (fwdbwd with case.ht)
Gates, beta and states stay float32 as in real models, where they are computed in
float32 and the recurrent state is kept in float32.
"""

from __future__ import annotations

import hashlib
import math

import ml_dtypes
import numpy as np

from cases.case import Case, CaseError
from cases.layouts import PER_HEAD, STATE, TIME, Layout, Tensor, declare
from cases.stages import stage_tensors

STORAGE_DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
FP32_INPUTS = ("g", "g_gamma", "beta", "b", "initial_state", "dht")


def rng_for(seed: int, name: str) -> np.random.Generator:
    """A Philox stream keyed by (seed, tensor name): independent of draw order."""
    key = int.from_bytes(hashlib.sha256(f"parity/{seed}/{name}".encode()).digest()[:16], "little")
    return np.random.Generator(np.random.Philox(key=key))


def seed_at(seed: int, k: int) -> int:
    """The k-th input seed of a case whose own seed is `seed`: k = 0 is the seed itself, later ones
    are derived from it (sha256 of "parity/seed/<seed>/<k>", 31 bits), so that every run of the
    case draws the same seeds in the same order."""
    if k == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"parity/seed/{seed}/{k}".encode()).digest()[:4], "little") & 0x7FFFFFFF


def alibi_slopes(H: int) -> np.ndarray:
    """ALiBi slopes for H heads (Press et al.), including non-powers of two. [H] float64."""

    def power_of_2(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(H).is_integer():
        return np.array(power_of_2(H))
    closest = 2 ** math.floor(math.log2(H))
    return np.array(power_of_2(closest) + list(alibi_slopes(2 * closest)[0::2][: H - closest]))


def alibi_g_gamma(H: int, layer: int = 0, layers: int = 1) -> np.ndarray:
    """g_gamma = -slope, spread over layers as in MiniMax / lightning attention:
    slope * (1 - layer / (layers - 1) + 1e-5). Layer 0 has the steepest decay. [H] float64."""
    factor = 1.0 if layers == 1 else 1.0 - layer / (layers - 1) + 1e-5
    return -alibi_slopes(H) * factor


def logsigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def input_tensors(case: Case) -> dict[str, Tensor]:
    """Shape and layout of every tensor input make_inputs returns (cu_seqlens aside), without
    drawing it; for a stage case, those of the op case its inputs are drawn from."""
    case = case.op_case
    B, T, H, K, V, N, HV = case.B, case.T, case.H, case.K, case.V, case.N, case.value_heads
    per_head = case.op in ("simple_gla", "gdn")
    gate = ((H,), PER_HEAD) if case.uses_g_gamma else ((B, T, HV) if per_head else (B, T, HV, K), TIME)
    tensors = {**declare(("q", "k"), (B, T, H, K), TIME), **declare(("v",), (B, T, HV, V), TIME)}
    tensors.update(declare((case.gate_name,), *gate))
    delta_gates = {"beta": (B, T, HV), "b": (B, T, HV, K), "w": (B, T, HV, V)}
    for name in case.delta_gates:
        tensors.update(declare((name,), delta_gates[name], TIME))
    if case.h0:
        tensors.update(declare(("initial_state",), (N, HV, K, V), STATE))
    if case.backward:
        tensors.update(declare(("do",), (B, T, HV, V), TIME))
        if case.ht:
            tensors.update(declare(("dht",), (N, HV, K, V), STATE))
    return tensors


def input_shapes(case: Case) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor input (input_tensors)."""
    return {name: t.shape for name, t in input_tensors(case).items()}


def output_tensors(case: Case) -> dict[str, Tensor]:
    """Shape and layout of every tensor the case's outputs (Case.output_names) can name: an op's o,
    ht and gradients (each gradient as its input), or a stage's (cases.stages)."""
    if case.stage is not None:
        return stage_tensors(case)
    B, T, K, V, N, HV = case.B, case.T, case.K, case.V, case.N, case.value_heads
    grads = {"d" + name: t for name, t in input_tensors(case).items() if name not in ("do", "dht")}
    grads["dh0"] = grads.pop("dinitial_state", Tensor((N, HV, K, V), STATE))
    return {**declare(("o",), (B, T, HV, V), TIME), **declare(("ht",), (N, HV, K, V), STATE), **grads}


def layout_of(case: Case, name: str) -> Layout:
    """The declared layout of output `name` of `case`; KeyError naming the declared ones otherwise."""
    tensors = output_tensors(case)
    if name not in tensors:
        raise KeyError(f"{case.kind} declares no layout for {name!r}: it declares {sorted(tensors)}")
    return tensors[name].layout


def storage_dtype(case: Case, name: str) -> np.dtype:
    """The dtype input `name` is stored and passed in."""
    return np.dtype(np.float32) if name in FP32_INPUTS else STORAGE_DTYPES[case.dtype]


def _gate(case: Case, shape: tuple[int, ...]) -> tuple[str, np.ndarray]:
    p = case.gate_kwargs
    rng = rng_for(case.seed, case.gate_name)
    if case.gate == "g_logsig":
        return "g", logsigmoid(rng.standard_normal(shape)) / p["norm"]
    if case.gate == "g_stress":
        return "g", -p["mag"] * rng.uniform(0.5, 1.5, shape)
    if case.gate == "gamma_alibi":
        return "g_gamma", alibi_g_gamma(case.H, p["layer"], p["layers"])
    if case.gate == "gamma_stress":
        return "g_gamma", -p["mag"] * rng.uniform(0.5, 1.5, (case.H,))
    if case.gate == "gamma_retnet":
        return "g_gamma", np.log1p(-(2.0 ** (-5.0 - np.arange(case.H))))
    raise AssertionError(case.gate)  # Case validation makes this unreachable


def make_inputs_f64(case: Case) -> dict[str, np.ndarray]:
    """All inputs in float64, before rounding to their storage dtype."""
    shapes = input_shapes(case)
    normal = lambda name: rng_for(case.seed, name).standard_normal(shapes[name])
    x = {"q": normal("q"), "k": normal("k"), "v": normal("v")}
    if case.delta_gates:  # the delta-rule ops
        for n in ("q", "k"):
            x[n] = x[n] / np.linalg.norm(x[n], axis=-1, keepdims=True)
    name, gate = _gate(case, shapes[case.gate_name])
    x[name] = gate
    for name in case.delta_gates:  # sigmoid of a normal, each from its own stream
        x[name] = 1.0 / (1.0 + np.exp(-normal(name)))
    for name in ("initial_state", "do", "dht"):
        if name in shapes:
            x[name] = normal(name)
    return x


def make_inputs(case: Case) -> dict[str, np.ndarray]:
    """The case's inputs in their storage dtypes (see module docstring). A stage case's inputs
    include the oracle's intermediates: parity.model.inputs.case_inputs builds them."""
    if case.stage is not None:
        raise CaseError(f"case {case.id} is a stage case: its inputs are parity.model.inputs.case_inputs's")
    out = {}
    for name, val in make_inputs_f64(case).items():
        out[name] = np.ascontiguousarray(val.astype(storage_dtype(case, name)))
    if case.seqlens is not None:
        out["cu_seqlens"] = np.asarray(case.cu_seqlens, dtype=np.int64)
    return out


# The largest case the harness accepts, counted over every input make_inputs draws (the
# float64 draw of the largest suite, `full`, is 0.67e9 elements, 5.4 GB); `parity run
# --max-elements / --max-bytes` override them.
MAX_INPUT_ELEMENTS = 2**30
MAX_INPUT_BYTES = 8 * 2**30


def input_size(case: Case) -> tuple[int, int]:
    """(elements, bytes) of the case's inputs as make_inputs_f64 draws them (float64)."""
    n = sum(math.prod(s) for s in input_shapes(case).values())
    return n, 8 * n


def check_size(case: Case, max_elements: int = MAX_INPUT_ELEMENTS, max_bytes: int = MAX_INPUT_BYTES) -> None:
    """CaseError when the case's inputs exceed the limits (before anything is allocated)."""
    n, nbytes = input_size(case)
    if n > max_elements or nbytes > max_bytes:
        raise CaseError(
            f"case {case.id}: inputs of {n} elements ({nbytes} bytes in float64) exceed the limit of "
            f"{max_elements} elements and {max_bytes} bytes (--max-elements, --max-bytes)"
        )


def input_hash(inputs: dict[str, np.ndarray]) -> str:
    """sha256 over every input's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(inputs):
        a = np.ascontiguousarray(inputs[name])
        h.update(f"{name}|{a.dtype.name}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()
