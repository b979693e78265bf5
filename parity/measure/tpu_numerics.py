"""TPU numerics on a machine without a TPU: every matmul of the TPU side computed as the MXU does.

TPU interpret mode and XLA:CPU compute every float32 dot in float32, whatever its precision;
a TPU does not. What the real TPU compiler emits (jax 0.10.2, libtpu 0.0.42.1, read from
Mosaic's post-lower-to-llo module and XLA:TPU, identical on v4, v5e, v5p, v6e and TPU7x):

    operands          precision            on the MXU
    bf16 x bf16       any                  1 pass, exact products, float32 accumulation
    f32 (x f32|bf16)  DEFAULT              1 pass: each float32 operand rounded to bfloat16
                                           (nearest even), exact products, f32 accumulation
    f32               HIGH                 3 passes (bf16_3x: hi*hi + hi*lo + lo*hi)
    f32               HIGHEST              6 passes (bf16_6x: each operand split into three
                                           bfloat16 pieces, the six products of order <= 2)

The model (`tpu-mxu-v1`) is one lowering rule for `dot_general` on the CPU platform,
installed for the whole process: it rewrites each float32 dot into the bfloat16 passes
above, by the precision the dot resolved to at trace time (so `jax_default_matmul_precision`
and per-call `precision=` are honoured), and leaves every other dot alone. Because TPU
interpret mode binds each kernel-body primitive inside the traced program, the rule reaches
dots inside Pallas kernels and in the XLA code around them, forward and backward (a
transposed dot keeps its primal's precision parameter), through scan, while, cond,
custom_vjp/custom_jvp and nested jit. Kernels are never edited. float64 dots (the oracle)
and torch (FLA) are untouched.

What it does not emulate (its limits, written down):
- accumulation order inside the MXU: the passes are summed in float32 by XLA:CPU's dot, in
  its own order (differences at float32 rounding, ~1e-7 relative);
- transcendental approximations (exp, log, rsqrt on the TPU's vector unit) are CPU libm;
- bf16 arithmetic on the vector unit of v6e and TPU7x: elementwise bf16 ops are computed
  as XLA:CPU computes them (widened to float32 and rounded back);

Dots on the vector unit. Mosaic does not send every dot to the MXU: some it computes on the
vector unit in float32, and the compiled module holds no MXU matmul for them (measured, libtpu
0.0.42, v5e, v6e and TPU7x alike: x [8, 128] @ y.T with y a single row [1, 128]; with y of 8
rows, or [H, 1, K] x [H, K, V] batched, or [1, K] x [K, N], the MXU). Which dots, the model
does not guess: the compile check (parity.execute.tpu_compile) reads each Pallas
kernel's compiled module for a target and decides, per kernel and matmul class, which of the
kernel's dots ran on the vector unit (parity.execute.mosaic_llo.vector_unit). Inside
`deciding(vector_unit, source)`, the dots of those classes in those kernels are computed in
float32 (XLA:CPU's own dot), all others as above; `decision()` is what the records state
(`notes.tpu_numerics`: the kernels and classes on the vector unit and where that came from).
Without a compile every dot is an MXU dot. The kernel a dot belongs to is known while it is
lowered: TPU interpret mode lowers a kernel's body inside pallas_call's lowering, which this
module wraps on the CPU platform to note the kernel's name (`kernel_name`, the name Mosaic gives
it); dot lowerings are not shared between kernels (not cached), and the decision is part of
jax's trace context (a jit traced under one decision is never reused under another).
"""

from __future__ import annotations

import contextlib
import functools
import os

from parity.model import environ

MODELS = ("tpu-mxu-v1", "float32")
DEFAULT_MODEL = "tpu-mxu-v1"
ENV = "PARITY_TPU_NUMERICS"

_state = {"model": None, "installed": False, "inner": False, "kernel": None, "vector_unit": {}, "source": None}
CLASSES = {0: "bf16", 1: "f32x1", 3: "f32x3", 6: "f32x6"}  # MXU passes -> matmul class


def check_model(name: str) -> str:
    if name not in MODELS:
        raise ValueError(f"numerics model {name!r}: expected one of {list(MODELS)}")
    return name


def exported(model: str | None):
    """`model` in the environment (ENV) while inside, for the worker processes a run starts there
    to inherit; the variable as it was after. None: nothing changes (the workers inherit what is set)."""
    return environ.exported({ENV: check_model(model)} if model else {})


def active() -> str:
    """The model the TPU side computes under in this process (installs it on first use)."""
    if _state["model"] is None:
        activate(os.environ.get(ENV, DEFAULT_MODEL))
    return _state["model"]


def activate(name: str) -> None:
    """Set the process-wide model; clears jax's caches when it changes (compiled dots differ)."""
    check_model(name)
    _install()
    if _state["model"] not in (None, name):
        import jax

        jax.clear_caches()
    _state["model"] = name


@contextlib.contextmanager
def using(name: str):
    """The model `name` inside the block, the previous one after it."""
    prev = active()
    activate(name)
    try:
        yield
    finally:
        activate(prev)


# ------------------------------------------------------------------ dots on the vector unit
def kernel_name(params) -> str:
    """The name Mosaic gives a pallas_call's kernel (its `name=`, else its kernel function's),
    from the pallas_call equation's params."""
    from jax._src.interpreters import mlir

    return mlir.sanitize_name(params["name"] or params["jaxpr"].debug_info.func_name)


def dot_class(lhs_dtype, rhs_dtype, precision) -> str:
    """The matmul class of one dot on the MXU: bf16, f32x1, f32x3 or f32x6."""
    return CLASSES[passes(lhs_dtype, rhs_dtype, precision)]


@functools.cache
def _decision_context():
    import jax

    return jax.make_user_context(None)  # created once: jax adds user contexts non-thread-safely


@contextlib.contextmanager
def deciding(vector_unit: dict, source: str):
    """Inside: the dots of kernel k whose class is in vector_unit[k] are computed in float32 (the
    vector unit), the rest on the MXU model; `source` says where that was decided (e.g. "compile
    for v5e"). vector_unit: {kernel name: [class, ...]}."""
    saved = _state["vector_unit"], _state["source"]
    decided = {k: frozenset(v) for k, v in vector_unit.items() if v}
    key = (source, tuple(sorted((k, tuple(sorted(v))) for k, v in decided.items())))
    _state["vector_unit"], _state["source"] = decided, source
    try:
        with _decision_context()(f"parity-tpu-numerics:{key}"):
            yield
    finally:
        _state["vector_unit"], _state["source"] = saved


def decision() -> dict:
    """What the records state: {"vector_unit": {kernel: [classes]}, "source": ...}; without a
    decision, every dot on the MXU, decided by nothing but the model."""
    if _state["source"] is None:
        return {"vector_unit": {}, "source": "none: no compile for the emulated target, every dot on the MXU"}
    return {"vector_unit": {k: sorted(v) for k, v in sorted(_state["vector_unit"].items())}, "source": _state["source"]}


# ------------------------------------------------------------------ precision -> passes
def passes(lhs_dtype, rhs_dtype, precision) -> int:
    """MXU passes of one dot on a TPU: 1, 3 or 6; 0 when it has no float32 operand (bf16 x bf16,
    float64, integers: not rewritten)."""
    import numpy as np

    f32 = np.dtype("float32")
    if f32 not in (np.dtype(lhs_dtype), np.dtype(rhs_dtype)):
        return 0
    return _precision_passes(precision)


def _precision_passes(precision) -> int:
    from jax import lax

    if precision is None:
        return 1
    if isinstance(precision, tuple):
        return max(_precision_passes(p) for p in precision)
    if isinstance(precision, lax.Precision):
        return {lax.Precision.DEFAULT: 1, lax.Precision.HIGH: 3, lax.Precision.HIGHEST: 6}[precision]
    name = getattr(precision, "name", str(precision)).upper()
    presets = {
        "DEFAULT": 1,
        "BF16_BF16_F32": 1,
        "BF16_BF16_BF16": 1,
        "BF16_BF16_F32_X3": 3,
        "BF16_BF16_F32_X6": 6,
        "F32_F32_F32": 6,
    }
    if name not in presets:
        raise NotImplementedError(f"tpu-mxu-v1: dot algorithm {name} has no TPU model (known: {sorted(presets)})")
    return presets[name]


def _split(x, pieces: int):
    """x (float32) as `pieces` bfloat16-valued float32 terms (round to nearest even) whose sum
    approximates x, largest first."""
    import jax.numpy as jnp

    out, rest = [], x
    for _ in range(pieces):
        p = rest.astype(jnp.bfloat16).astype(jnp.float32)
        out.append(p)
        rest = rest - p
    return out


# terms (i, j) of the split products each pass count sums, smallest first as XLA's bf16_nx do
_TERMS = {1: [(0, 0)], 3: [(1, 0), (0, 1), (0, 0)], 6: [(2, 0), (0, 2), (1, 1), (1, 0), (0, 1), (0, 0)]}


def emulated_dot(lhs, rhs, *, dimension_numbers, preferred_element_type, n_passes: int):
    """The TPU's float32 dot as a sum of passes, each a float32 dot of bfloat16-valued operands
    (products of two bfloat16 numbers are exact in float32; sums in float32, in _TERMS' order).
    The passes are one batched dot over a new leading axis (the operands' pieces stacked), so
    that XLA:CPU compiles one dot instead of up to six: each pass is still its own float32 dot,
    the same bits as `per_pass_dot` (tests/test_tpu_numerics.py), at a third of the compile time
    of a kernel full of HIGHEST dots. Lowered with the rule bypassed (`_state["inner"]`), so each
    pass is XLA:CPU's own float32 dot."""
    import jax.numpy as jnp

    a, b, terms = _pieces(lhs, rhs, n_passes)
    if len(terms) == 1:
        parts = [_pass(a[terms[0][0]], b[terms[0][1]], dimension_numbers)]
    else:
        (lc, rc), (lb, rb) = dimension_numbers
        shift = lambda dims: tuple(d + 1 for d in dims)
        stacked = ((shift(lc), shift(rc)), ((0, *shift(lb)), (0, *shift(rb))))  # the passes: a batch axis in front
        batched = _pass(jnp.stack([a[i] for i, _ in terms]), jnp.stack([b[j] for _, j in terms]), stacked)
        parts = [batched[k] for k in range(len(terms))]
    return _summed(parts, preferred_element_type or jnp.result_type(lhs, rhs))


def per_pass_dot(lhs, rhs, *, dimension_numbers, preferred_element_type, n_passes: int):
    """emulated_dot written plainly: one float32 dot per pass, summed in _TERMS' order (what the
    batched form must equal bit for bit)."""
    import jax.numpy as jnp

    a, b, terms = _pieces(lhs, rhs, n_passes)
    parts = [_pass(a[i], b[j], dimension_numbers) for i, j in terms]
    return _summed(parts, preferred_element_type or jnp.result_type(lhs, rhs))


def _summed(parts, out_dtype):
    """The passes' float32 results added in their order (_TERMS'), then cast to the dot's dtype."""
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total.astype(out_dtype)


def _pieces(lhs, rhs, n_passes: int):
    """(lhs pieces, rhs pieces, the (i, j) terms of the passes that exist): a bfloat16 operand is
    exact already, one piece."""
    import jax.numpy as jnp

    f32 = jnp.float32
    pieces = {1: 1, 3: 2, 6: 3}[n_passes]
    a = _split(lhs.astype(f32), pieces) if lhs.dtype != jnp.bfloat16 else [lhs.astype(f32)]
    b = _split(rhs.astype(f32), pieces) if rhs.dtype != jnp.bfloat16 else [rhs.astype(f32)]
    return a, b, [(i, j) for i, j in _TERMS[n_passes] if i < len(a) and j < len(b)]


def _pass(a, b, dimension_numbers):
    """One MXU pass: a float32 dot of bfloat16-valued float32 operands, exact products."""
    import jax.numpy as jnp
    from jax import lax

    return lax.dot_general(a, b, dimension_numbers, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _install() -> None:
    if _state["installed"]:
        return
    from jax._src.interpreters import mlir
    from jax._src.lax import lax as lax_internal

    original = functools.partial(lax_internal._dot_general_lower, platform="cpu")

    def rule(ctx, lhs, rhs, *, dimension_numbers, precision, preferred_element_type, out_sharding=None, **kw):
        a_in, b_in = ctx.avals_in
        model_on = _state["model"] == "tpu-mxu-v1" and not _state["inner"]
        n = passes(a_in.dtype, b_in.dtype, precision) if model_on else 0
        if CLASSES[n] in _state["vector_unit"].get(_state["kernel"], ()):
            n = 0  # on the vector unit, in float32
        params = dict(
            dimension_numbers=dimension_numbers,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
            **kw,
        )
        if n == 0:
            return original(ctx, lhs, rhs, **params)
        fn = functools.partial(
            emulated_dot, n_passes=n, dimension_numbers=dimension_numbers, preferred_element_type=preferred_element_type
        )
        _state["inner"] = True
        try:
            return mlir.lower_fun(fn, multiple_results=False)(ctx, lhs, rhs)
        finally:
            _state["inner"] = False

    # not cached: the same dot in two kernels may be decided differently
    mlir.register_lowering(lax_internal.dot_general_p, rule, platform="cpu", cacheable=False)
    _install_kernel_names()
    _state["installed"] = True


def _install_kernel_names() -> None:
    """pallas_call's lowering on the CPU platform (TPU interpret mode), noting the kernel whose
    body is being lowered in _state["kernel"]; jax's own rule does the rest."""
    from jax._src.interpreters import mlir
    from jax._src.pallas import pallas_call

    original = pallas_call._pallas_call_lowering

    def rule(ctx, *in_nodes, **params):
        saved = _state["kernel"]
        _state["kernel"] = kernel_name(params)
        try:
            return original(ctx, *in_nodes, **params)
        finally:
            _state["kernel"] = saved

    mlir.register_lowering(pallas_call.pallas_call_p, rule, platform="cpu")
